//! The `route.cloudevents*` keys compiled into the CloudEvents output ([`crate::cloudevents`]):
//! the `source` and `subject` templates, their defaults, and the `datacontenttype`.

use bytes::Bytes;

use crate::base::table_name::TableName;
use crate::base::template::Template;
use crate::compile::config::{CloudEventsMode, OutboxConfig, RouteConfig};
use crate::compile::validate::{problem, ConfigErrors};
use crate::encode::cloudevents::{default_source, CloudEvents, Text};

/// Compiles the `route.cloudevents*` keys; `None` when `cloudevents = "none"`. Template
/// errors are reported by `validate`, so they cannot happen here.
pub(crate) fn compile_cloudevents(
    outbox: &OutboxConfig,
    route: &RouteConfig,
    table: &TableName,
) -> Result<Option<CloudEvents>, ConfigErrors> {
    if route.cloudevents == CloudEventsMode::None {
        return Ok(None);
    }
    let source = match &route.cloudevents_source {
        Some(t) => Text::parse(t).map_err(|e| problem("route.cloudevents_source", e))?,
        None => Text::Fixed(Bytes::from(default_source(table))),
    };
    let subject = match &route.cloudevents_subject {
        Some(t) if t.is_empty() => None,
        Some(t) => Some(Text::parse(t).map_err(|e| problem("route.cloudevents_subject", e))?),
        None => Some(Text::Template(
            Template::parse_text(&format!("{{{}}}", outbox.aggregate_id_column))
                .map_err(|e| problem("outbox.aggregate_id_column", e))?,
        )),
    };
    Ok(Some(CloudEvents::new(
        route.cloudevents,
        source,
        subject,
        route.cloudevents_data_content_type.clone().map(Bytes::from),
    )))
}
