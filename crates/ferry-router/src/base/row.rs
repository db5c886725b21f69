//! The router's input: one outbox row seen through [`OutboxRow`], decoupled from the WAL reader.
//!
//! The reader hands column values in pgoutput's *text* output format (bytea as `\x0a0b`, uuid and
//! jsonb as text, timestamptz as `2026-11-22 10:00:00.123+00`), or in the type's binary send format
//! when the subscription asked for binary (`binary: true`). A value is a [`Value`], a range of the
//! bytes it arrived in: the router reads it in place, and the payload travels to the producer as a
//! slice of those bytes, without a copy.

use bytes::Bytes;
pub use ferry_pgtypes::Value;

/// PostgreSQL type OIDs the router knows (`pg_type.oid`, fixed for built-in types).
pub mod oid {
    /// `bool`
    pub const BOOL: u32 = 16;
    /// `bytea`
    pub const BYTEA: u32 = 17;
    /// `"char"` (single byte)
    pub const CHAR: u32 = 18;
    /// `name`
    pub const NAME: u32 = 19;
    /// `int8` / `bigint`
    pub const INT8: u32 = 20;
    /// `int2` / `smallint`
    pub const INT2: u32 = 21;
    /// `int4` / `integer`
    pub const INT4: u32 = 23;
    /// `text`
    pub const TEXT: u32 = 25;
    /// `oid`
    pub const OID: u32 = 26;
    /// `json`
    pub const JSON: u32 = 114;
    /// `xml`
    pub const XML: u32 = 142;
    /// `float4`
    pub const FLOAT4: u32 = 700;
    /// `float8`
    pub const FLOAT8: u32 = 701;
    /// `unknown`
    pub const UNKNOWN: u32 = 705;
    /// `bpchar` / `char(n)`
    pub const BPCHAR: u32 = 1042;
    /// `varchar`
    pub const VARCHAR: u32 = 1043;
    /// `timestamp` (without time zone)
    pub const TIMESTAMP: u32 = 1114;
    /// `timestamptz`
    pub const TIMESTAMPTZ: u32 = 1184;
    /// `numeric`
    pub const NUMERIC: u32 = 1700;
    /// `uuid`
    pub const UUID: u32 = 2950;
    /// `jsonb`
    pub const JSONB: u32 = 3802;
}

/// One column value of a row.
#[derive(Debug, Clone, Copy)]
pub struct ColumnRef<'a> {
    /// The column's type OID (from the relation).
    pub type_oid: u32,
    /// The value; `None` is SQL NULL.
    pub value: Option<Value<'a>>,
    /// `true` if the value is in the type's binary send format (pgoutput `'b'`), `false` for text.
    pub binary: bool,
}

/// A column a router reads on every row under a role that names one column of its table
/// ([`crate::Router::slot_columns`]). For one router, a slot always names the same column, so a
/// row may remember where that column is instead of finding it by name on every row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    EventId = 0,
    AggregateId = 1,
    Payload = 2,
    EventType = 3,
    /// The topic plan's column, when it reads exactly one.
    TopicInput = 4,
}

impl Slot {
    /// How many slots there are.
    pub const COUNT: usize = 5;
    /// Every slot, in the order of their numbers.
    pub const ALL: [Slot; Slot::COUNT] = [
        Slot::EventId,
        Slot::AggregateId,
        Slot::Payload,
        Slot::EventType,
        Slot::TopicInput,
    ];
}

/// A row the router can read columns from, by name.
pub trait OutboxRow {
    /// The named column, or `None` if the relation has no such column.
    fn column(&self, name: &str) -> Option<ColumnRef<'_>>;

    /// The column `name`, which the router reads as `slot` (see [`Slot`]); by name unless the
    /// row knows the slot's place.
    fn column_for(&self, slot: Slot, name: &str) -> Option<ColumnRef<'_>> {
        let _ = slot;
        self.column(name)
    }
}

impl<T: OutboxRow + ?Sized> OutboxRow for &T {
    fn column(&self, name: &str) -> Option<ColumnRef<'_>> {
        (**self).column(name)
    }

    fn column_for(&self, slot: Slot, name: &str) -> Option<ColumnRef<'_>> {
        (**self).column_for(slot, name)
    }
}

/// One column of a [`SimpleRow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleColumn {
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Value (`None` = NULL).
    pub value: Option<Bytes>,
    /// Binary format?
    pub binary: bool,
}

/// An owned row: a list of named columns. Used for table-less messages and handy in tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimpleRow {
    /// The columns, in relation order.
    pub columns: Vec<SimpleColumn>,
}

impl SimpleRow {
    /// An empty row.
    pub fn new() -> Self {
        SimpleRow::default()
    }

    /// Adds a text-format column (replacing one of the same name).
    pub fn push(&mut self, name: &str, type_oid: u32, value: Option<Bytes>) {
        self.push_column(SimpleColumn {
            name: name.to_owned(),
            type_oid,
            value,
            binary: false,
        });
    }

    /// Adds a column (replacing one of the same name).
    pub fn push_column(&mut self, column: SimpleColumn) {
        match self.columns.iter_mut().find(|c| c.name == column.name) {
            Some(c) => *c = column,
            None => self.columns.push(column),
        }
    }

    /// Builder: a text-format column of type `type_oid`.
    pub fn with(mut self, name: &str, type_oid: u32, value: &str) -> Self {
        self.push(
            name,
            type_oid,
            Some(Bytes::copy_from_slice(value.as_bytes())),
        );
        self
    }

    /// Builder: a `text` column.
    pub fn text(self, name: &str, value: &str) -> Self {
        self.with(name, oid::TEXT, value)
    }

    /// Builder: a NULL column of type `type_oid`.
    pub fn null(mut self, name: &str, type_oid: u32) -> Self {
        self.push(name, type_oid, None);
        self
    }

    /// Builder: a binary-format column.
    pub fn binary(mut self, name: &str, type_oid: u32, value: &[u8]) -> Self {
        self.push_column(SimpleColumn {
            name: name.to_owned(),
            type_oid,
            value: Some(Bytes::copy_from_slice(value)),
            binary: true,
        });
        self
    }

    /// Builder: removes a column.
    pub fn without(mut self, name: &str) -> Self {
        self.columns.retain(|c| c.name != name);
        self
    }
}

impl OutboxRow for SimpleRow {
    fn column(&self, name: &str) -> Option<ColumnRef<'_>> {
        self.columns
            .iter()
            .find(|c| c.name == name)
            .map(|c| ColumnRef {
                type_oid: c.type_oid,
                value: c.value.as_ref().map(Value::from),
                binary: c.binary,
            })
    }
}
