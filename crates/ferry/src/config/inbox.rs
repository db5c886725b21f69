//! `[inbox]`: what `ferry inbox` consumes and where it writes (the other keys it uses are
//! `[postgres]`'s connection, `[kafka]`'s brokers and properties, `[http]`, `[log]`).

use serde::{Deserialize, Serialize};

use super::duration::ConfigDuration;
use super::kafka::Brokers;
use super::validate::Problems;

/// A comma-separated list in the environment, a string or an array in the file: the same
/// shape as `kafka.brokers`.
pub type TopicList = Brokers;

/// `[inbox]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboxConfig {
    /// The topics to consume (required by `ferry inbox`).
    pub topics: TopicList,
    /// The consumer group; the offsets in the database are kept per group.
    pub group_id: String,
    /// The inbox table; its companions take its name with `_dedup`, `_dead_letters`,
    /// `_offsets` and `_marks` appended, in its schema.
    pub table: String,
    /// Create the tables (as `sql/inbox.sql` does) when they are missing.
    pub create_tables: bool,
    /// The type of the `payload` column: `jsonb`, `text` or `bytea`.
    pub payload_type: String,
    /// The header that carries the event id to deduplicate by; `""` for none.
    pub event_id_header: String,
    /// Drop `ferry run`'s own replays by their `ferry-position` header.
    pub positions: bool,
    /// Where a group with no stored offset starts a partition: `earliest` or `latest`.
    pub start: String,
    /// How long an event id is remembered.
    pub dedup_retention: ConfigDuration,
    /// How long a processed row stays (`0s`: until the application deletes it).
    pub processed_retention: ConfigDuration,
    /// How often expired deduplication rows and processed rows are deleted.
    pub cleanup_interval: ConfigDuration,
    /// Rows per DELETE of the cleanup: each is its own short transaction.
    pub cleanup_batch: u64,
    /// Most records in one database transaction.
    pub max_batch_records: u64,
    /// How long a lone record may wait for others before its transaction.
    pub max_batch_delay: ConfigDuration,
    /// Most record bytes held in memory.
    #[serde(
        deserialize_with = "ferry_router::size::deserialize",
        serialize_with = "ferry_router::size::serialize"
    )]
    pub max_buffered_bytes: u64,
    /// `NOTIFY <channel>` after each transaction that stored rows; `""` for none.
    pub notify_channel: String,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            topics: Brokers::default(),
            group_id: "ferry-inbox".into(),
            table: "public.ferry_inbox".into(),
            create_tables: true,
            payload_type: "jsonb".into(),
            event_id_header: "id".into(),
            positions: false,
            start: "earliest".into(),
            dedup_retention: std::time::Duration::from_secs(7 * 24 * 3600).into(),
            processed_retention: std::time::Duration::from_secs(7 * 24 * 3600).into(),
            cleanup_interval: std::time::Duration::from_secs(60).into(),
            cleanup_batch: 5_000,
            max_batch_records: 5_000,
            max_batch_delay: std::time::Duration::ZERO.into(),
            max_buffered_bytes: 32 << 20,
            notify_channel: "ferry_inbox".into(),
        }
    }
}

impl InboxConfig {
    pub fn payload(&self) -> ferry_core::inbox::PayloadType {
        use ferry_core::inbox::PayloadType;
        match self.payload_type.as_str() {
            "text" => PayloadType::Text,
            "bytea" => PayloadType::Bytea,
            _ => PayloadType::Jsonb,
        }
    }

    pub fn table_name(&self) -> Result<ferry_router::TableName, String> {
        self.table.parse()
    }
}

/// The rules of `[inbox]` that hold whatever the command (the topics are required only by
/// `ferry inbox`, which checks them itself).
pub(super) fn problems(c: &InboxConfig, p: &mut Problems) {
    if let Err(e) = c.table_name() {
        p.add("inbox.table", e);
    }
    if !matches!(c.payload_type.as_str(), "jsonb" | "text" | "bytea") {
        p.add(
            "inbox.payload_type",
            format!(
                "must be \"jsonb\", \"text\" or \"bytea\" (the type of the inbox's payload column), got {:?}",
                c.payload_type
            ),
        );
    }
    if !matches!(c.start.as_str(), "earliest" | "latest") {
        p.add(
            "inbox.start",
            format!("must be \"earliest\" or \"latest\", got {:?}", c.start),
        );
    }
    if c.group_id.trim().is_empty() {
        p.add("inbox.group_id", "must not be empty");
    }
    if c.topics.0.iter().any(|t| t.is_empty()) {
        p.add("inbox.topics", "an entry is empty");
    }
    if c.max_batch_records == 0 {
        p.add("inbox.max_batch_records", "must be at least 1");
    }
    if c.cleanup_batch == 0 {
        p.add("inbox.cleanup_batch", "must be at least 1");
    }
    if c.max_buffered_bytes < 1 << 20 {
        p.add("inbox.max_buffered_bytes", "must be at least 1MiB");
    }
    p.positive("inbox.cleanup_interval", c.cleanup_interval);
    p.positive("inbox.dedup_retention", c.dedup_retention);
    if c.notify_channel.len() > 63 {
        p.add(
            "inbox.notify_channel",
            "must be at most 63 bytes (a PostgreSQL identifier)",
        );
    }
}
