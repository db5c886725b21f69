//! What the outbox needs from the database ([`SlotSpec`], with a [`TableSpec`] per outbox table),
//! and the quoting of identifiers and literals in the SQL built from it.

/// What the outbox needs from the database.
#[derive(Debug, Clone)]
pub struct SlotSpec {
    pub slot: String,
    pub publication: String,
    /// The outbox tables (at least one), all in the one publication.
    pub tables: Vec<TableSpec>,
    pub create_slot: bool,
    pub create_publication: bool,
    /// A failover slot (PostgreSQL 17+): created with `failover = true`, or made one, so a
    /// standby with `sync_replication_slots` keeps a copy that survives a promotion.
    pub failover: bool,
}

/// An outbox table and the columns read from it.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub schema: String,
    pub table: String,
    /// The configuration key that names the table (`outbox.table`), for messages.
    pub config_key: String,
    /// Columns the router reads, with the types it accepts.
    pub required_columns: Vec<RequiredColumn>,
}

impl TableSpec {
    /// A table read with no column requirements, named by `outbox.table`.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Self {
        TableSpec {
            schema: schema.into(),
            table: table.into(),
            config_key: "outbox.table".into(),
            required_columns: Vec::new(),
        }
    }

    /// The quoted, schema-qualified name (`"public"."outbox"`).
    pub fn qualified(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl SlotSpec {
    /// The tables, quoted and comma-separated, as `CREATE PUBLICATION ... FOR TABLE` lists them.
    pub fn table_list(&self) -> String {
        self.tables
            .iter()
            .map(TableSpec::qualified)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What the reader counts as the outbox: these tables, and the messages with `message_prefix`.
    pub fn outbox_source(&self, message_prefix: Option<String>) -> crate::assembly::OutboxSource {
        crate::assembly::OutboxSource {
            tables: self
                .tables
                .iter()
                .map(|t| crate::assembly::SourceTable {
                    schema: t.schema.clone(),
                    table: t.table.clone(),
                })
                .collect(),
            message_prefix,
            other_tables: crate::assembly::OtherTables::default(),
            oids: Vec::new(),
        }
    }

    /// The SQL that creates the publication for every table.
    pub fn create_publication_sql(&self) -> String {
        format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert', publish_via_partition_root = true)",
            quote_ident(&self.publication),
            self.table_list()
        )
    }
}

/// A column the router needs.
#[derive(Debug, Clone)]
pub struct RequiredColumn {
    pub name: String,
    /// The configuration key that names it, for the error message (`outbox.payload_column`).
    pub config_key: String,
    /// The types the caller can read there; `None` accepts any type.
    pub accepted_types: Option<AcceptedTypes>,
}

/// The types a [`RequiredColumn`] may have. Which types, and what to tell an operator whose
/// column has another, are the caller's policy (the router's), not the reader's.
#[derive(Debug, Clone)]
pub struct AcceptedTypes {
    /// Accepted type OIDs.
    pub oids: Vec<u32>,
    /// The fix reported when the column has another type, e.g. "use a column of type jsonb, ...".
    pub fix: String,
}

/// Quotes an SQL identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Quotes an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
