//! Why the connector options that no translation step handled have no equivalent: Debezium and
//! Kafka Connect options grouped by what they do, each group with what Ferry does instead.
//! [`reason`] is asked last, for every option still unhandled; an option it does not know gets a
//! generic note, so nothing is dropped silently.

/// Why a connector option left over after translation has no equivalent, for the options Ferry
/// knows about; `None` for the rest.
pub(super) fn reason(key: &str) -> Option<String> {
    let has = |prefixes: &[&str]| prefixes.iter().any(|p| key.starts_with(p));
    let is = |keys: &[&str]| keys.contains(&key);
    let reason = if has(&["snapshot."]) {
        "Ferry never snapshots (see snapshot.mode)"
    } else if has(&["incremental.snapshot.", "signal.", "notification."]) || is(&["read.only"]) {
        "Ferry has no signals, notifications or incremental snapshots"
    } else if has(&["heartbeat.", "topic.heartbeat."]) {
        "Ferry needs no heartbeat records or writes: it confirms keepalive positions itself when \
         nothing is in flight; drop a heartbeat table that only this connector used"
    } else if has(&["topic.creation."]) {
        "Ferry creates no topics: create them with these settings before the first run \
         (`ferry check` lists the topics the outbox's rows route to)"
    } else if has(&["topic."]) || is(&["database.server.name"]) {
        "names Debezium's own topics (heartbeats, transaction metadata, the topic before routing); \
         Ferry's topics come from [route] alone"
    } else if has(&[
        "schema.include.list",
        "schema.exclude.list",
        "schema.whitelist",
        "schema.blacklist",
        "table.exclude.list",
        "table.blacklist",
        "column.",
        "message.key.columns",
    ]) {
        "Ferry reads exactly outbox.table, with all its columns"
    } else if has(&["message.prefix."]) {
        "Ferry relays logical decoding messages only as table-less outbox events \
         (outbox.message_prefix, a different format: see ferry-router's config.md)"
    } else if is(&[
        "decimal.handling.mode",
        "time.precision.mode",
        "binary.handling.mode",
        "hstore.handling.mode",
        "interval.handling.mode",
        "include.unknown.datatypes",
        "money.fraction.digits",
        "datatype.propagate.source.type",
        "converters",
        "unavailable.value.placeholder",
        "schema.name.adjustment.mode",
        "field.name.adjustment.mode",
        "schema.refresh.mode",
        "tombstones.on.delete",
        "skipped.operations",
        "provide.transaction.metadata",
        "include.schema.comments",
        "xmin.fetch.interval.ms",
    ]) {
        "shapes Debezium's change events, which Ferry does not produce: it sends the payload as \
         stored and placed columns as their text"
    } else if is(&["event.processing.failure.handling.mode"]) {
        "Ferry stops on WAL it cannot decode (nothing is skipped silently); rows it cannot route \
         follow route.on_error"
    } else if is(&[
        "max.batch.size",
        "max.queue.size",
        "max.queue.size.in.bytes",
        "poll.interval.ms",
    ]) {
        "Debezium's internal queue; Ferry's bound on unacknowledged records is \
         kafka.max_in_flight_records and kafka.max_in_flight_bytes"
    } else if is(&[
        "errors.max.retries",
        "retriable.restart.connector.wait.ms",
        "slot.max.retries",
        "slot.retry.delay.ms",
    ]) {
        "Ferry retries transient failures (a busy slot, an unreachable server) without limit, \
         waiting postgres.reconnect_backoff_min doubling up to postgres.reconnect_backoff_max"
    } else if is(&["slot.stream.params"]) {
        "Ferry passes pgoutput's parameters (proto_version, publication_names) itself"
    } else if is(&["database.initial.statements"]) {
        "Ferry runs no statements on connecting; set session parameters on its role instead \
         (ALTER ROLE ... SET ...)"
    } else if has(&["consumer.override.", "admin.override."]) {
        "Ferry runs no Kafka consumer or admin client with separate settings; [kafka.properties] \
         configures its one producer"
    } else if is(&[
        "offsets.storage.topic",
        "exactly.once.support",
        "transaction.boundary",
        "transaction.boundary.interval.ms",
    ]) {
        "Ferry keeps its position in the replication slot, confirmed only after Kafka \
         acknowledges (at least once: consumers deduplicate on the id header)"
    } else if has(&["predicates"]) {
        "Ferry applies no SMT predicates: it routes only the outbox table's rows"
    } else if has(&["transforms."]) {
        "belongs to a transform not listed in transforms, which Kafka Connect ignored too"
    } else {
        return None;
    };
    Some(reason.to_owned())
}
