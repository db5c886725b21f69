//! Encoding pgoutput messages: the server's side of the format, for round-trip tests, byte
//! fixtures, fuzzing and for other crates' tests that synthesize a replication stream.
//!
//! The encoder writes exactly what [`super::decode`] reads: the streamed-form xid exactly when a
//! message's `xid` is `Some`, so `decode(m.encode(), m.stream_xid().is_some()) == m`.
//!
//! # Panics
//!
//! Encoding panics only on values the wire cannot carry, which are programming errors in the
//! caller: more than `i16::MAX` columns, more than `i32::MAX` truncated relations, a value or
//! message content longer than `i32::MAX` bytes. Strings must not contain NUL (no PostgreSQL
//! identifier can); one that does encodes to a message that does not decode.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;

impl PgOutputMessage {
    /// The encoded message.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode_into(&mut buf);
        buf.freeze()
    }

    /// Appends the encoded message to `buf`.
    pub fn encode_into(&self, buf: &mut BytesMut) {
        buf.put_u8(self.tag());
        match self {
            PgOutputMessage::Begin(m) => {
                buf.put_u64(m.final_lsn.0);
                buf.put_i64(m.commit_time.0);
                buf.put_u32(m.xid);
            }
            PgOutputMessage::Commit(m) => {
                buf.put_u8(m.flags);
                buf.put_u64(m.commit_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.commit_time.0);
            }
            PgOutputMessage::Origin(m) => {
                buf.put_u64(m.commit_lsn.0);
                put_string(buf, &m.name);
            }
            PgOutputMessage::Relation(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.oid);
                put_string(buf, &m.namespace);
                put_string(buf, &m.name);
                buf.put_u8(m.replica_identity.to_byte());
                buf.put_i16(count_i16(m.columns.len(), "relation columns"));
                for c in &m.columns {
                    buf.put_u8(c.flags);
                    put_string(buf, &c.name);
                    buf.put_u32(c.type_oid);
                    buf.put_i32(c.type_modifier);
                }
            }
            PgOutputMessage::Type(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.oid);
                put_string(buf, &m.namespace);
                put_string(buf, &m.name);
            }
            PgOutputMessage::Insert(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.relation_oid);
                buf.put_u8(b'N');
                put_tuple(buf, &m.new);
            }
            PgOutputMessage::Update(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.relation_oid);
                if let Some(old) = &m.old {
                    put_old_tuple(buf, old);
                }
                buf.put_u8(b'N');
                put_tuple(buf, &m.new);
            }
            PgOutputMessage::Delete(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.relation_oid);
                put_old_tuple(buf, &m.old);
            }
            PgOutputMessage::Truncate(m) => {
                put_xid(buf, m.xid);
                buf.put_i32(count_i32(m.relation_oids.len(), "truncated relations"));
                buf.put_u8(m.options);
                for oid in &m.relation_oids {
                    buf.put_u32(*oid);
                }
            }
            PgOutputMessage::Message(m) => {
                put_xid(buf, m.xid);
                buf.put_u8(u8::from(m.transactional));
                buf.put_u64(m.lsn.0);
                put_string(buf, &m.prefix);
                put_counted(buf, &m.content);
            }
            PgOutputMessage::StreamStart(m) => {
                buf.put_u32(m.xid);
                buf.put_u8(u8::from(m.first_segment));
            }
            PgOutputMessage::StreamStop => {}
            PgOutputMessage::StreamCommit(m) => {
                buf.put_u32(m.xid);
                buf.put_u8(m.flags);
                buf.put_u64(m.commit_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.commit_time.0);
            }
            PgOutputMessage::StreamAbort(m) => {
                buf.put_u32(m.xid);
                buf.put_u32(m.subxact_xid);
            }
        }
    }
}

fn put_xid(buf: &mut BytesMut, xid: Option<u32>) {
    if let Some(xid) = xid {
        buf.put_u32(xid);
    }
}

fn put_string(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}

fn put_counted(buf: &mut BytesMut, data: &[u8]) {
    buf.put_i32(count_i32(data.len(), "value length"));
    buf.put_slice(data);
}

fn put_old_tuple(buf: &mut BytesMut, old: &OldTuple) {
    let (marker, values) = match old {
        OldTuple::Key(v) => (b'K', v),
        OldTuple::Full(v) => (b'O', v),
    };
    buf.put_u8(marker);
    put_tuple(buf, values);
}

fn put_tuple(buf: &mut BytesMut, tuple: &Tuple) {
    buf.put_i16(count_i16(tuple.len(), "tuple columns"));
    for v in tuple.iter() {
        match v {
            ValueRef::Null => buf.put_u8(b'n'),
            ValueRef::UnchangedToast => buf.put_u8(b'u'),
            ValueRef::Text(data) => {
                buf.put_u8(b't');
                put_counted(buf, data.as_slice());
            }
            ValueRef::Binary(data) => {
                buf.put_u8(b'b');
                put_counted(buf, data.as_slice());
            }
        }
    }
}

fn count_i16(n: usize, what: &str) -> i16 {
    i16::try_from(n).unwrap_or_else(|_| panic!("pgoutput encode: {n} {what} exceed Int16"))
}

fn count_i32(n: usize, what: &str) -> i32 {
    i32::try_from(n).unwrap_or_else(|_| panic!("pgoutput encode: {n} {what} exceed Int32"))
}
