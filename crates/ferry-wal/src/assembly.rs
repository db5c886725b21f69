//! Outbox transaction assembly: turns a decoded pgoutput (protocol version 1) stream into the
//! events the pipeline acts on — transaction boundaries, outbox rows and outbox messages.
//!
//! # What it does
//!
//! [`Assembler::push`] takes each decoded message with the `wal_start` of the XLogData it came
//! in, and returns at most one [`OutboxEvent`]:
//!
//! - **Begin / Commit for every transaction**, even one without outbox rows: the pipeline needs
//!   every `end_lsn` to move the checkpoint past WAL that holds nothing for it.
//! - **A Row per INSERT into an outbox table** (there may be several, each row says which),
//!   yielded as it arrives. A transaction is never
//!   buffered here: with protocol version 1 the server sends a transaction only once it has
//!   committed, so a row can be produced as soon as it is read; the pipeline still checkpoints
//!   only at the Commit's `end_lsn`.
//! - **A Message per transactional logical decoding message** whose prefix is the configured
//!   one (`pg_logical_emit_message(true, prefix, content)`), an alternative to the table.
//!
//! - **An error for an INSERT into a table the publication lists by name** that is none of the
//!   outbox tables ([`OtherTables`]): skipping it would confirm the slot past a row someone
//!   published to be relayed.
//!
//! Everything else is counted in [`AssemblyStats`] and skipped: inserts into other tables of a
//! publication `FOR ALL TABLES` or `FOR TABLES IN SCHEMA`, UPDATE/DELETE/TRUNCATE (on the outbox, which suggests someone edits it by hand, separately
//! from other tables), non-transactional messages (which are not atomic with anything, so
//! relaying them would break the outbox contract), messages with other prefixes. Origin and Type
//! messages are ignored.
//!
//! # Relations
//!
//! Rows carry no column names: each Insert names a relation oid whose layout the server sent
//! earlier in a Relation message (before the first change of each relation in a session, and
//! again whenever the relation changes). The assembler keeps the latest layout per oid in an
//! [`Arc`]; each row holds the snapshot it was decoded with, so a column added or reordered
//! mid-stream maps later rows by name correctly while earlier rows keep their meaning. A
//! Relation is matched to the [`OutboxSource`] when it arrives, so the per-row cost is a hash
//! lookup, an `Arc` clone and the move of the decoded values.
//!
//! # Misuse
//!
//! The stream must be well-formed: a Commit without Begin, a Begin inside a transaction, a
//! Commit whose `commit_lsn` differs from the Begin's `final_lsn`, a change or transactional
//! message outside a transaction, a change to a relation never described, an outbox row whose
//! column count differs from its relation's, and any protocol version 2 stream message are an
//! [`AssemblyError`] naming the xid and LSN. Such an error means the stream cannot be trusted:
//! the caller should stop. A reconnect starts a new reader, with a new `Assembler`: the server
//! resends relations and restarts at a transaction boundary. ([`Assembler::reset`] does the same
//! to an existing one, keeping its stats; only the assembly model test uses it.)

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for relation OIDs, looked up once per row: a multiply instead of SipHash (whose
/// resistance to chosen keys is not needed for numbers the server assigns; ~100 instructions
/// a row saved).
#[derive(Debug, Default)]
struct OidHasher(u64);

impl Hasher for OidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
use std::sync::Arc;

use bytes::Bytes;

use crate::lsn::Lsn;
use crate::pgoutput::{
    Column, PgOutputMessage, PgTimestamp, Relation, ReplicaIdentity, Tuple, TupleValue, ValueRef,
};

/// What counts as the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSource {
    /// The outbox tables (at least one). A row says which by its position here
    /// ([`OutboxRow::table`]).
    pub tables: Vec<SourceTable>,
    /// If set, transactional logical messages with exactly this prefix are outbox records too.
    pub message_prefix: Option<String>,
    /// What an INSERT into a published table that is none of `tables` means.
    pub other_tables: OtherTables,
    /// Relations that are outbox tables whatever their name says: each table's own oid and its
    /// partitions', with the table's position in `tables`. A row committed before a rename, or
    /// under a partition while the publication published per partition, carries the name and
    /// relation it had then.
    pub oids: Vec<(u32, usize)>,
}

/// What the reader does with an INSERT into a published table that is none of the outbox tables.
///
/// A table the publication lists by name is there to be relayed: skipping its rows would confirm
/// the slot past them, and they would never reach Kafka. So such a row stops the reader
/// ([`AssemblyError::UnrelayedInsert`], before its transaction commits, so nothing from that
/// transaction on is confirmed) unless it is skipped by design:
///
/// - the publication covers tables wholesale: `FOR ALL TABLES` ([`OtherTables::all`]), or
///   `FOR TABLES IN SCHEMA` (PostgreSQL 15+, [`OtherTables::schemas`]);
/// - the operator took the table out of the publication ([`OtherTables::tables`]): PostgreSQL
///   decodes with the catalog as of each transaction, so rows committed while it was in are
///   still in the stream after `ALTER PUBLICATION ... DROP TABLE`.
///
/// The default skips nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtherTables {
    pub all: bool,
    pub schemas: Vec<String>,
    pub tables: Vec<SourceTable>,
}

impl OtherTables {
    /// Whether an INSERT into this table, which is no outbox table, is skipped (else refused).
    pub fn skips(&self, namespace: &str, name: &str) -> bool {
        self.all
            || self.schemas.iter().any(|s| s == namespace)
            || self
                .tables
                .iter()
                .any(|t| t.schema == namespace && t.table == name)
    }
}

impl OutboxSource {
    /// One outbox table.
    pub fn table(
        schema: impl Into<String>,
        table: impl Into<String>,
        message_prefix: Option<String>,
    ) -> Self {
        OutboxSource {
            tables: vec![SourceTable {
                schema: schema.into(),
                table: table.into(),
            }],
            message_prefix,
            other_tables: OtherTables::default(),
            oids: Vec::new(),
        }
    }

    /// The position of the table a relation is, if it is one of the outbox tables: by name, or
    /// by oid ([`OutboxSource::oids`]).
    fn position(&self, namespace: &str, name: &str, oid: u32) -> Option<usize> {
        self.tables
            .iter()
            .position(|t| t.schema == namespace && t.table == name)
            .or_else(|| self.oids.iter().find(|(o, _)| *o == oid).map(|(_, i)| *i))
    }
}

/// An outbox table, as PostgreSQL stores its name (and pgoutput's Relation message reports it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    /// The table's schema, as in `pg_namespace` (e.g. `public`).
    pub schema: String,
    /// The table's name.
    pub table: String,
}

/// What the pipeline is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxEvent {
    Begin(TxnBegin),
    Row(OutboxRow),
    Message(OutboxMessage),
    Commit(TxnCommit),
}

/// A transaction starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnBegin {
    pub xid: u32,
    /// The Begin's `final_lsn`: where the commit record starts.
    pub commit_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// A transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnCommit {
    pub xid: u32,
    pub commit_lsn: Lsn,
    /// The end of the commit record: what becomes the checkpoint once the transaction's records
    /// are durable.
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
    /// Rows and messages yielded for this transaction.
    pub rows: u64,
}

/// An INSERT into an outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub xid: u32,
    /// Which outbox table: the position in [`OutboxSource::tables`].
    pub table: usize,
    /// The `wal_start` of the XLogData that carried the Insert.
    pub lsn: Lsn,
    /// The relation layout the row was decoded with.
    pub relation: Arc<RelationInfo>,
    /// Column values in `relation.columns` order.
    pub values: Tuple,
}

impl OutboxRow {
    /// The named column's type oid and value, owned.
    pub fn get(&self, column: &str) -> Option<(u32, TupleValue)> {
        let (type_oid, value) = self.at(self.relation.column_index(column)?)?;
        Some((type_oid, value.to_value()))
    }

    /// The type oid and value of the column at position `i` of the relation, borrowed.
    pub fn at(&self, i: usize) -> Option<(u32, ValueRef<'_>)> {
        let type_oid = self.relation.columns.get(i)?.type_oid;
        Some((type_oid, self.values.value(i)?))
    }
}

/// A transactional logical decoding message with the outbox prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    pub xid: u32,
    /// The `wal_start` of the XLogData that carried the message.
    pub lsn: Lsn,
    /// The message's own LSN, as sent in the message.
    pub message_lsn: Lsn,
    /// The content: a zero-copy slice of the replication data.
    pub content: Bytes,
}

/// A relation's layout as last described by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationInfo {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: ReplicaIdentity,
    pub columns: Vec<Column>,
}

impl RelationInfo {
    /// The position of the named column in tuples of this relation.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

impl From<Relation> for RelationInfo {
    fn from(r: Relation) -> Self {
        RelationInfo {
            oid: r.oid,
            namespace: r.namespace,
            name: r.name,
            replica_identity: r.replica_identity,
            columns: r.columns,
        }
    }
}

/// Counters of what was seen and skipped. Cumulative: [`Assembler::reset`] keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssemblyStats {
    /// Commits seen.
    pub transactions: u64,
    /// Relation messages seen.
    pub relations: u64,
    /// Outbox rows yielded.
    pub outbox_rows: u64,
    /// Outbox messages yielded.
    pub outbox_messages: u64,
    /// Skipped UPDATEs of the outbox table.
    pub outbox_updates: u64,
    /// Skipped DELETEs from the outbox table.
    pub outbox_deletes: u64,
    /// Skipped TRUNCATEs that included the outbox table.
    pub outbox_truncates: u64,
    /// Skipped INSERTs into other tables.
    pub other_inserts: u64,
    /// Skipped UPDATEs of other tables.
    pub other_updates: u64,
    /// Skipped DELETEs from other tables.
    pub other_deletes: u64,
    /// Skipped TRUNCATEs of other tables only.
    pub other_truncates: u64,
    /// Skipped non-transactional messages with the outbox prefix.
    pub non_transactional_outbox_messages: u64,
    /// Skipped messages with another prefix (or any prefix when none is configured).
    pub other_messages: u64,
}

/// Why the stream could not be assembled; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("Commit (commit_lsn {commit_lsn}) at {lsn} without a Begin")]
    CommitWithoutBegin { commit_lsn: Lsn, lsn: Lsn },
    #[error("Begin of xid {xid} at {lsn} while xid {open_xid} (commit_lsn {open_commit_lsn}) is still open")]
    BeginInsideTransaction {
        xid: u32,
        lsn: Lsn,
        open_xid: u32,
        open_commit_lsn: Lsn,
    },
    #[error("Commit of xid {xid} at {lsn} has commit_lsn {commit_lsn}, but its Begin said {begin_final_lsn}")]
    CommitLsnMismatch {
        xid: u32,
        lsn: Lsn,
        begin_final_lsn: Lsn,
        commit_lsn: Lsn,
    },
    #[error("{what} at {lsn} outside a transaction")]
    OutsideTransaction { what: &'static str, lsn: Lsn },
    #[error("{what} of xid {xid} at {lsn} names relation oid {oid}, which no Relation message described")]
    UnknownRelation {
        what: &'static str,
        xid: u32,
        lsn: Lsn,
        oid: u32,
    },
    #[error(
        "INSERT into {namespace}.{name} (xid {xid}, at {lsn}): the table is in the publication, but no \
         [outbox] or [[tables]] entry relays it"
    )]
    UnrelayedInsert {
        xid: u32,
        lsn: Lsn,
        /// The relation's oid, and its name when the row was committed.
        oid: u32,
        namespace: String,
        name: String,
    },
    #[error("outbox row of xid {xid} at {lsn} has {values} values but relation {namespace}.{name} has {columns} columns")]
    ColumnCountMismatch {
        xid: u32,
        lsn: Lsn,
        namespace: String,
        name: String,
        values: usize,
        columns: usize,
    },
    #[error("{what} (in-stream xid {stream_xid:?}) at {lsn} in transaction {xid:?}: streaming messages need protocol version 2, and Ferry reads version 1")]
    StreamingMessage {
        what: &'static str,
        xid: Option<u32>,
        stream_xid: Option<u32>,
        lsn: Lsn,
    },
}

#[derive(Debug, Clone)]
struct CachedRelation {
    info: Arc<RelationInfo>,
    /// The outbox table it is, if it is one.
    outbox: Option<usize>,
}

impl CachedRelation {
    fn is_outbox(&self) -> bool {
        self.outbox.is_some()
    }
}

#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    xid: u32,
    commit_lsn: Lsn,
    yielded: u64,
}

/// The assembly state machine; see the module docs.
#[derive(Debug)]
pub struct Assembler {
    source: OutboxSource,
    relations: HashMap<u32, CachedRelation, BuildHasherDefault<OidHasher>>,
    txn: Option<OpenTxn>,
    stats: AssemblyStats,
}

impl Assembler {
    pub fn new(source: OutboxSource) -> Self {
        Assembler {
            source,
            relations: HashMap::default(),
            txn: None,
            stats: AssemblyStats::default(),
        }
    }

    pub fn source(&self) -> &OutboxSource {
        &self.source
    }

    pub fn stats(&self) -> &AssemblyStats {
        &self.stats
    }

    /// The xid of the open transaction, if any.
    pub fn open_xid(&self) -> Option<u32> {
        self.txn.map(|t| t.xid)
    }

    /// The cached layout of a relation.
    pub fn relation(&self, oid: u32) -> Option<&Arc<RelationInfo>> {
        self.relations.get(&oid).map(|r| &r.info)
    }

    /// Forgets relations and any open transaction (on reconnect). Stats are kept.
    pub fn reset(&mut self) {
        self.relations.clear();
        self.txn = None;
    }

    /// Feeds one message that arrived in an XLogData starting at `wal_start`.
    pub fn push(
        &mut self,
        wal_start: Lsn,
        msg: PgOutputMessage,
    ) -> Result<Option<OutboxEvent>, AssemblyError> {
        let lsn = wal_start;
        if let Some(stream_xid) = msg.stream_xid() {
            return Err(self.streaming(&msg, Some(stream_xid), lsn));
        }
        match msg {
            PgOutputMessage::Begin(b) => {
                if let Some(open) = self.txn {
                    return Err(AssemblyError::BeginInsideTransaction {
                        xid: b.xid,
                        lsn,
                        open_xid: open.xid,
                        open_commit_lsn: open.commit_lsn,
                    });
                }
                self.txn = Some(OpenTxn {
                    xid: b.xid,
                    commit_lsn: b.final_lsn,
                    yielded: 0,
                });
                Ok(Some(OutboxEvent::Begin(TxnBegin {
                    xid: b.xid,
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                })))
            }
            PgOutputMessage::Commit(c) => {
                let Some(open) = self.txn else {
                    return Err(AssemblyError::CommitWithoutBegin {
                        commit_lsn: c.commit_lsn,
                        lsn,
                    });
                };
                if open.commit_lsn != c.commit_lsn {
                    return Err(AssemblyError::CommitLsnMismatch {
                        xid: open.xid,
                        lsn,
                        begin_final_lsn: open.commit_lsn,
                        commit_lsn: c.commit_lsn,
                    });
                }
                self.txn = None;
                self.stats.transactions += 1;
                Ok(Some(OutboxEvent::Commit(TxnCommit {
                    xid: open.xid,
                    commit_lsn: c.commit_lsn,
                    end_lsn: c.end_lsn,
                    commit_time: c.commit_time,
                    rows: open.yielded,
                })))
            }
            PgOutputMessage::Origin(_) | PgOutputMessage::Type(_) => Ok(None),
            PgOutputMessage::Relation(r) => {
                let outbox = self.source.position(&r.namespace, &r.name, r.oid);
                let info = Arc::new(RelationInfo::from(r));
                self.relations
                    .insert(info.oid, CachedRelation { info, outbox });
                self.stats.relations += 1;
                Ok(None)
            }
            PgOutputMessage::Insert(i) => {
                let xid = self.open("Insert", lsn)?.xid;
                let rel = self.lookup("Insert", xid, lsn, i.relation_oid)?;
                let Some(table) = rel.outbox else {
                    if !self
                        .source
                        .other_tables
                        .skips(&rel.info.namespace, &rel.info.name)
                    {
                        return Err(AssemblyError::UnrelayedInsert {
                            xid,
                            lsn,
                            oid: rel.info.oid,
                            namespace: rel.info.namespace.clone(),
                            name: rel.info.name.clone(),
                        });
                    }
                    self.stats.other_inserts += 1;
                    return Ok(None);
                };
                if i.new.len() != rel.info.columns.len() {
                    return Err(AssemblyError::ColumnCountMismatch {
                        xid,
                        lsn,
                        namespace: rel.info.namespace.clone(),
                        name: rel.info.name.clone(),
                        values: i.new.len(),
                        columns: rel.info.columns.len(),
                    });
                }
                let relation = Arc::clone(&rel.info);
                self.stats.outbox_rows += 1;
                self.count_yield();
                Ok(Some(OutboxEvent::Row(OutboxRow {
                    xid,
                    table,
                    lsn,
                    relation,
                    values: i.new,
                })))
            }
            PgOutputMessage::Update(u) => {
                let xid = self.open("Update", lsn)?.xid;
                if self.lookup("Update", xid, lsn, u.relation_oid)?.is_outbox() {
                    self.stats.outbox_updates += 1;
                } else {
                    self.stats.other_updates += 1;
                }
                Ok(None)
            }
            PgOutputMessage::Delete(d) => {
                let xid = self.open("Delete", lsn)?.xid;
                if self.lookup("Delete", xid, lsn, d.relation_oid)?.is_outbox() {
                    self.stats.outbox_deletes += 1;
                } else {
                    self.stats.other_deletes += 1;
                }
                Ok(None)
            }
            PgOutputMessage::Truncate(t) => {
                let xid = self.open("Truncate", lsn)?.xid;
                let mut outbox = false;
                for &oid in &t.relation_oids {
                    outbox |= self.lookup("Truncate", xid, lsn, oid)?.is_outbox();
                }
                if outbox {
                    self.stats.outbox_truncates += 1;
                } else {
                    self.stats.other_truncates += 1;
                }
                Ok(None)
            }
            PgOutputMessage::Message(m) => {
                let ours = self.source.message_prefix.as_deref() == Some(m.prefix.as_str());
                if !m.transactional {
                    if ours {
                        self.stats.non_transactional_outbox_messages += 1;
                    } else {
                        self.stats.other_messages += 1;
                    }
                    return Ok(None);
                }
                let xid = self.open("transactional Message", lsn)?.xid;
                if !ours {
                    self.stats.other_messages += 1;
                    return Ok(None);
                }
                self.stats.outbox_messages += 1;
                self.count_yield();
                Ok(Some(OutboxEvent::Message(OutboxMessage {
                    xid,
                    lsn,
                    message_lsn: m.lsn,
                    content: m.content,
                })))
            }
            PgOutputMessage::StreamStart(s) => Err(self.streaming(&msg, Some(s.xid), lsn)),
            PgOutputMessage::StreamCommit(s) => Err(self.streaming(&msg, Some(s.xid), lsn)),
            PgOutputMessage::StreamAbort(s) => Err(self.streaming(&msg, Some(s.xid), lsn)),
            PgOutputMessage::StreamStop => Err(self.streaming(&msg, None, lsn)),
        }
    }

    fn open(&self, what: &'static str, lsn: Lsn) -> Result<OpenTxn, AssemblyError> {
        self.txn
            .ok_or(AssemblyError::OutsideTransaction { what, lsn })
    }

    fn lookup(
        &self,
        what: &'static str,
        xid: u32,
        lsn: Lsn,
        oid: u32,
    ) -> Result<&CachedRelation, AssemblyError> {
        self.relations
            .get(&oid)
            .ok_or(AssemblyError::UnknownRelation {
                what,
                xid,
                lsn,
                oid,
            })
    }

    fn count_yield(&mut self) {
        if let Some(txn) = &mut self.txn {
            txn.yielded += 1;
        }
    }

    fn streaming(&self, msg: &PgOutputMessage, stream_xid: Option<u32>, lsn: Lsn) -> AssemblyError {
        AssemblyError::StreamingMessage {
            what: crate::pgoutput::tag::name(msg.tag()).unwrap_or("message"),
            xid: self.open_xid(),
            stream_xid,
            lsn,
        }
    }
}
