//! The pgoutput logical decoding protocol (versions 1 and 2): message types, a zero-copy decoder
//! that never panics, and an encoder for tests and fakes.
//!
//! # The format
//!
//! Each XLogData payload of a pgoutput slot is one message: a one-byte tag, then big-endian
//! fields. Layouts are those of the PostgreSQL documentation, "Logical Replication Message
//! Formats" (the server side is `src/backend/replication/logical/proto.c`):
//!
//! ```text
//! Begin          'B'  Int64 final_lsn  Int64 commit_time  Int32 xid
//! Commit         'C'  Int8 flags  Int64 commit_lsn  Int64 end_lsn  Int64 commit_time
//! Origin         'O'  Int64 commit_lsn  String name
//! Relation       'R'  [Int32 xid]  Int32 oid  String namespace  String name  Int8 replica_identity
//!                     Int16 ncols  { Int8 flags  String name  Int32 type_oid  Int32 type_modifier }*
//! Type           'Y'  [Int32 xid]  Int32 oid  String namespace  String name
//! Insert         'I'  [Int32 xid]  Int32 relation_oid  'N' TupleData
//! Update         'U'  [Int32 xid]  Int32 relation_oid  [('K' | 'O') TupleData]  'N' TupleData
//! Delete         'D'  [Int32 xid]  Int32 relation_oid  ('K' | 'O') TupleData
//! Truncate       'T'  [Int32 xid]  Int32 nrelations  Int8 options  { Int32 relation_oid }*
//! Message        'M'  [Int32 xid]  Int8 flags  Int64 lsn  String prefix  Int32 len  Byte(len) content
//! Stream Start   'S'  Int32 xid  Int8 first_segment
//! Stream Stop    'E'
//! Stream Commit  'c'  Int32 xid  Int8 flags  Int64 commit_lsn  Int64 end_lsn  Int64 commit_time
//! Stream Abort   'A'  Int32 xid  Int32 subxact_xid
//! TupleData           Int16 ncols  { 'n' | 'u' | ('t' | 'b') Int32 len Byte(len) }*
//! ```
//!
//! `String` is NUL-terminated. The bracketed `[Int32 xid]` exists only in protocol version 2 and
//! only for messages sent *inside a stream block* (between Stream Start and Stream Stop) — the
//! bytes alone cannot tell, so decoding takes that context: [`decode`] has an explicit
//! `in_stream` flag and [`Decoder`] tracks it from the Stream Start/Stop messages it sees. In the
//! decoded types the field is `xid: Option<u32>`, `Some` exactly in the streamed form, and the
//! encoder writes it exactly when it is `Some`. Stream Commit and Stream Abort are sent outside
//! stream blocks; in protocol version 1 no stream messages exist at all.
//!
//! # Decoding rules
//!
//! - **Zero copy.** The input is a [`Bytes`]; message contents are slices of it, and a tuple's
//!   values are ranges of it ([`Tuple`]), sliced only when kept.
//!   Names (relation, column, type, origin, message prefix) are validated as UTF-8 and copied into
//!   `String`s: they are short and, except the message prefix, rare.
//! - **Never panics.** Lengths and counts are signed on the wire: a negative one is an error, and a
//!   count is checked against the bytes left (each item has a minimum size) before anything is
//!   allocated for it.
//! - **Exact.** A message must end where its last field ends; trailing bytes mean a protocol
//!   mismatch and are an error. Fields with a documented closed set of values (replica identity,
//!   tuple column kinds, boolean flags) reject anything else; fields documented as flags are
//!   kept raw. Hence a decoded message re-encodes to exactly the bytes it came from.
//! - **Typed errors.** A [`DecodeError`] carries the tag, the byte offset (0 is the tag) and a
//!   [`DecodeErrorKind`].

mod decode;
mod encode;
mod error;
pub(crate) mod spare;

use bytes::Bytes;

use crate::lsn::Lsn;
pub use crate::wire::PgTimestamp;
pub use ferry_pgtypes::Value;

pub use decode::{decode, Decoder};
pub use error::{DecodeError, DecodeErrorKind};

/// One pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgOutputMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(Type),
    Insert(Insert),
    /// Boxed, as [`PgOutputMessage::Delete`]: an outbox is only inserted into, and every
    /// message is moved at the size of the largest variant (an Update has two tuples).
    Update(Box<Update>),
    Delete(Box<Delete>),
    Truncate(Truncate),
    Message(LogicalMessage),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
}

/// Message tags, as on the wire.
pub mod tag {
    pub const BEGIN: u8 = b'B';
    pub const COMMIT: u8 = b'C';
    pub const ORIGIN: u8 = b'O';
    pub const RELATION: u8 = b'R';
    pub const TYPE: u8 = b'Y';
    pub const INSERT: u8 = b'I';
    pub const UPDATE: u8 = b'U';
    pub const DELETE: u8 = b'D';
    pub const TRUNCATE: u8 = b'T';
    pub const MESSAGE: u8 = b'M';
    pub const STREAM_START: u8 = b'S';
    pub const STREAM_STOP: u8 = b'E';
    pub const STREAM_COMMIT: u8 = b'c';
    pub const STREAM_ABORT: u8 = b'A';

    /// The documentation's name for a tag, `None` for an unknown one.
    pub fn name(tag: u8) -> Option<&'static str> {
        Some(match tag {
            BEGIN => "Begin",
            COMMIT => "Commit",
            ORIGIN => "Origin",
            RELATION => "Relation",
            TYPE => "Type",
            INSERT => "Insert",
            UPDATE => "Update",
            DELETE => "Delete",
            TRUNCATE => "Truncate",
            MESSAGE => "Message",
            STREAM_START => "Stream Start",
            STREAM_STOP => "Stream Stop",
            STREAM_COMMIT => "Stream Commit",
            STREAM_ABORT => "Stream Abort",
            _ => return None,
        })
    }
}

impl PgOutputMessage {
    /// The message's wire tag.
    pub fn tag(&self) -> u8 {
        match self {
            PgOutputMessage::Begin(_) => tag::BEGIN,
            PgOutputMessage::Commit(_) => tag::COMMIT,
            PgOutputMessage::Origin(_) => tag::ORIGIN,
            PgOutputMessage::Relation(_) => tag::RELATION,
            PgOutputMessage::Type(_) => tag::TYPE,
            PgOutputMessage::Insert(_) => tag::INSERT,
            PgOutputMessage::Update(_) => tag::UPDATE,
            PgOutputMessage::Delete(_) => tag::DELETE,
            PgOutputMessage::Truncate(_) => tag::TRUNCATE,
            PgOutputMessage::Message(_) => tag::MESSAGE,
            PgOutputMessage::StreamStart(_) => tag::STREAM_START,
            PgOutputMessage::StreamStop => tag::STREAM_STOP,
            PgOutputMessage::StreamCommit(_) => tag::STREAM_COMMIT,
            PgOutputMessage::StreamAbort(_) => tag::STREAM_ABORT,
        }
    }

    /// The in-stream xid of a message in its streamed form (see the module docs), `None` for the
    /// non-streamed form and for messages that never carry one.
    pub fn stream_xid(&self) -> Option<u32> {
        match self {
            PgOutputMessage::Relation(m) => m.xid,
            PgOutputMessage::Type(m) => m.xid,
            PgOutputMessage::Insert(m) => m.xid,
            PgOutputMessage::Update(m) => m.xid,
            PgOutputMessage::Delete(m) => m.xid,
            PgOutputMessage::Truncate(m) => m.xid,
            PgOutputMessage::Message(m) => m.xid,
            _ => None,
        }
    }
}

/// Begin (`'B'`): a transaction's changes follow, up to its Commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// Where the commit record starts: the transaction's `commit_lsn`.
    pub final_lsn: Lsn,
    pub commit_time: PgTimestamp,
    pub xid: u32,
}

/// Commit (`'C'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Currently unused (0); kept raw.
    pub flags: u8,
    /// Equal to the Begin's `final_lsn`.
    pub commit_lsn: Lsn,
    /// The end of the commit record: what is checkpointed.
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// Origin (`'O'`): the changes were replicated from another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The commit LSN on the origin server.
    pub commit_lsn: Lsn,
    pub name: String,
}

/// Relation (`'R'`): the column layout of a relation, sent before its first change in a session
/// and again whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    pub oid: u32,
    /// The schema; empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    pub replica_identity: ReplicaIdentity,
    /// Published columns in tuple order (generated columns are not sent).
    pub columns: Vec<Column>,
}

/// `pg_class.relreplident`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaIdentity {
    /// `'d'`: the primary key.
    Default,
    /// `'n'`: nothing.
    Nothing,
    /// `'f'`: all columns.
    Full,
    /// `'i'`: a chosen unique index.
    Index,
}

impl ReplicaIdentity {
    /// The `relreplident` byte.
    pub fn to_byte(self) -> u8 {
        match self {
            ReplicaIdentity::Default => b'd',
            ReplicaIdentity::Nothing => b'n',
            ReplicaIdentity::Full => b'f',
            ReplicaIdentity::Index => b'i',
        }
    }

    /// From the `relreplident` byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            b'd' => ReplicaIdentity::Default,
            b'n' => ReplicaIdentity::Nothing,
            b'f' => ReplicaIdentity::Full,
            b'i' => ReplicaIdentity::Index,
            _ => return None,
        })
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Bit 1: part of the replica identity key. Kept raw.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod`, -1 when none.
    pub type_modifier: i32,
}

impl Column {
    /// Flag bit marking a key column.
    pub const FLAG_KEY: u8 = 1;

    /// Whether the column is part of the replica identity key.
    pub fn is_key(&self) -> bool {
        self.flags & Self::FLAG_KEY != 0
    }
}

/// Type (`'Y'`): a non-built-in data type's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    pub oid: u32,
    pub namespace: String,
    pub name: String,
}

/// One column value of a tuple, owned: what [`ValueRef::to_value`] makes, and what a [`Tuple`]
/// for a test or a fake is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// `'n'`: SQL NULL.
    Null,
    /// `'u'`: an unchanged TOASTed value whose data was not sent.
    UnchangedToast,
    /// `'t'`: the value in text format.
    Text(Bytes),
    /// `'b'`: the value in binary format (only with the `binary` option).
    Binary(Bytes),
}

/// A tuple's column values where they arrived: each value is a range of the message's bytes,
/// so decoding a row takes no reference count per column. [`Tuple::value`] reads one in place;
/// [`Value::to_bytes`] makes an owned slice (one reference count) of a value that is kept.
///
/// A tuple is one pointer: a decoded message, and the outbox event made of it, move several times
/// between the reader and the pipeline, at the size of their largest variant.
///
/// Two tuples are equal when their values are, wherever their bytes are held.
#[derive(Clone, Default)]
pub struct Tuple(Option<Box<Parts>>);

/// A tuple's bytes and columns, in one allocation that goes back to the spares when the tuple
/// drops ([`spare`]). `None` in [`Tuple`] is a tuple without columns.
#[derive(Clone, Default)]
pub(crate) struct Parts {
    /// The bytes the values are ranges of (the whole message they were decoded from).
    pub(crate) data: Bytes,
    pub(crate) cols: Vec<Col>,
}

/// The parts of a tuple without columns.
static NO_PARTS: Parts = Parts {
    data: Bytes::new(),
    cols: Vec::new(),
};

/// One column of a [`Tuple`]: its kind, and for a value, its range in [`Parts::data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    Null,
    UnchangedToast,
    Text { start: u32, end: u32 },
    Binary { start: u32, end: u32 },
}

/// A column value of a [`Tuple`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueRef<'a> {
    /// `'n'`: SQL NULL.
    Null,
    /// `'u'`: an unchanged TOASTed value whose data was not sent.
    UnchangedToast,
    /// `'t'`: the value in text format.
    Text(Value<'a>),
    /// `'b'`: the value in binary format.
    Binary(Value<'a>),
}

impl ValueRef<'_> {
    /// The value, owned ([`TupleValue`]).
    pub fn to_value(&self) -> TupleValue {
        match self {
            ValueRef::Null => TupleValue::Null,
            ValueRef::UnchangedToast => TupleValue::UnchangedToast,
            ValueRef::Text(s) => TupleValue::Text(s.to_bytes()),
            ValueRef::Binary(s) => TupleValue::Binary(s.to_bytes()),
        }
    }
}

impl Tuple {
    /// A tuple of `parts`' columns, ranges of its data (the decoder checked them).
    pub(crate) fn from_parts(parts: Box<Parts>) -> Self {
        Tuple(Some(parts))
    }

    fn parts(&self) -> &Parts {
        self.0.as_deref().unwrap_or(&NO_PARTS)
    }

    /// How many columns the tuple has.
    pub fn len(&self) -> usize {
        self.parts().cols.len()
    }

    /// Whether the tuple has no columns.
    pub fn is_empty(&self) -> bool {
        self.parts().cols.is_empty()
    }

    /// The value of column `i` (in the relation's column order), borrowed.
    pub fn value(&self, i: usize) -> Option<ValueRef<'_>> {
        let parts = self.parts();
        Some(parts.read(*parts.cols.get(i)?))
    }

    /// The values in column order, borrowed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = ValueRef<'_>> + '_ {
        let parts = self.parts();
        parts.cols.iter().map(|c| parts.read(*c))
    }

    /// The values in column order, owned.
    pub fn to_values(&self) -> Vec<TupleValue> {
        self.iter().map(|v| v.to_value()).collect()
    }
}

impl Parts {
    fn read(&self, col: Col) -> ValueRef<'_> {
        let value = |start: u32, end: u32| Value::new(&self.data, start as usize..end as usize);
        match col {
            Col::Null => ValueRef::Null,
            Col::UnchangedToast => ValueRef::UnchangedToast,
            Col::Text { start, end } => ValueRef::Text(value(start, end)),
            Col::Binary { start, end } => ValueRef::Binary(value(start, end)),
        }
    }
}

impl Drop for Tuple {
    fn drop(&mut self) {
        // The allocation serves the next tuple decoded on this thread.
        if let Some(parts) = self.0.take() {
            spare::give_back(parts);
        }
    }
}

/// A tuple of owned values (for tests and fakes): their bytes are copied into one buffer.
impl From<Vec<TupleValue>> for Tuple {
    fn from(values: Vec<TupleValue>) -> Self {
        let mut data = bytes::BytesMut::new();
        let mut at = |b: &Bytes| {
            let start = u32::try_from(data.len()).expect("a test tuple under 4 GiB");
            data.extend_from_slice(b);
            let end = u32::try_from(data.len()).expect("a test tuple under 4 GiB");
            (start, end)
        };
        let cols = values
            .iter()
            .map(|v| match v {
                TupleValue::Null => Col::Null,
                TupleValue::UnchangedToast => Col::UnchangedToast,
                TupleValue::Text(b) => {
                    let (start, end) = at(b);
                    Col::Text { start, end }
                }
                TupleValue::Binary(b) => {
                    let (start, end) = at(b);
                    Col::Binary { start, end }
                }
            })
            .collect();
        Tuple(Some(Box::new(Parts {
            data: data.freeze(),
            cols,
        })))
    }
}

impl PartialEq for Tuple {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Tuple {}

impl std::fmt::Debug for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Insert (`'I'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub new: Tuple,
}

/// The old row sent with an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `'K'`: the replica identity key columns (others are null).
    Key(Tuple),
    /// `'O'`: the whole old row (`REPLICA IDENTITY FULL`).
    Full(Tuple),
}

/// Update (`'U'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    /// Sent only when the key changed or the identity is `FULL`.
    pub old: Option<OldTuple>,
    pub new: Tuple,
}

/// Delete (`'D'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub old: OldTuple,
}

/// Truncate (`'T'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    /// Bit 1 `CASCADE`, bit 2 `RESTART IDENTITY`. Kept raw.
    pub options: u8,
    pub relation_oids: Vec<u32>,
}

impl Truncate {
    pub const OPTION_CASCADE: u8 = 1;
    pub const OPTION_RESTART_IDENTITY: u8 = 2;

    pub fn cascade(&self) -> bool {
        self.options & Self::OPTION_CASCADE != 0
    }

    pub fn restart_identity(&self) -> bool {
        self.options & Self::OPTION_RESTART_IDENTITY != 0
    }
}

/// Message (`'M'`): a logical decoding message from `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalMessage {
    /// Present only in the streamed form.
    pub xid: Option<u32>,
    /// Sent inside its transaction at commit (flags = 1), or immediately (flags = 0).
    pub transactional: bool,
    /// The message's own LSN.
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

/// Stream Start (`'S'`): a block of an in-progress transaction's changes follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    /// The first block for this xid.
    pub first_segment: bool,
}

/// Stream Commit (`'c'`): a streamed transaction committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    /// Currently unused (0); kept raw.
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// Stream Abort (`'A'`): a streamed (sub)transaction aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    /// Equal to `xid` when the top-level transaction aborted.
    pub subxact_xid: u32,
}
