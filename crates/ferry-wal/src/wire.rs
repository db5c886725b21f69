//! The CopyBoth sub-messages of PostgreSQL's streaming replication protocol, as pure codecs.
//!
//! After `START_REPLICATION`, the server sends CopyData messages whose payload starts with a
//! one-byte tag; the client answers with CopyData messages of its own. This module decodes and
//! encodes those payloads (the CopyData framing around them is [`crate::frame`]). Layouts
//! follow the PostgreSQL documentation, "Streaming Replication Protocol" (`START_REPLICATION`):
//!
//! ```text
//! XLogData                 'w'  Int64 wal_start  Int64 wal_end  Int64 server_time  Byte(n) data
//! Primary keepalive        'k'  Int64 wal_end    Int64 server_time  Byte1 reply_requested
//! Standby status update    'r'  Int64 write  Int64 flush  Int64 apply  Int64 client_time  Byte1 reply_requested
//! ```
//!
//! All integers are big-endian. The write/flush/apply positions are "the location of the last
//! WAL byte + 1" received, flushed and applied; times are microseconds since 2000-01-01
//! ([`PgTimestamp`]). For logical replication `data` is one output-plugin message (for Ferry a
//! pgoutput message, see [`crate::pgoutput`]) and `wal_start` is the LSN the plugin wrote it at.
//!
//! Decoding never panics and rejects anything that is not exactly one well-formed message
//! (missing bytes, trailing bytes after a keepalive or status update, a reply flag other than 0
//! or 1) with a [`WireError`] naming the tag and byte offset. `data` is a zero-copy slice of the
//! input.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::lsn::Lsn;

pub use ferry_pgtypes::PgTimestamp;

/// A server→client CopyData payload during streaming replication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// `'w'`: a chunk of WAL; for logical replication, one output-plugin message.
    XLogData(XLogData),
    /// `'k'`: the server's heartbeat, possibly asking for an immediate status update.
    PrimaryKeepalive(PrimaryKeepalive),
}

/// XLogData (`'w'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// The starting point of the WAL data in this message.
    pub wal_start: Lsn,
    /// The current end of WAL on the server.
    pub wal_end: Lsn,
    /// The server's clock at the time of transmission.
    pub server_time: PgTimestamp,
    /// The payload: a zero-copy slice of the CopyData message.
    pub data: Bytes,
}

/// Primary keepalive message (`'k'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    /// The current end of WAL on the server.
    pub wal_end: Lsn,
    /// The server's clock at the time of transmission.
    pub server_time: PgTimestamp,
    /// The server asks for a status update as soon as possible (to avoid a timeout disconnect).
    pub reply_requested: bool,
}

/// Standby status update (`'r'`), client→server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    /// Last WAL byte + 1 received and written.
    pub write_lsn: Lsn,
    /// Last WAL byte + 1 flushed: for a logical slot this is what becomes `confirmed_flush_lsn`.
    pub flush_lsn: Lsn,
    /// Last WAL byte + 1 applied.
    pub apply_lsn: Lsn,
    /// The client's clock at the time of transmission.
    pub client_time: PgTimestamp,
    /// Ask the server to reply immediately (with a keepalive).
    pub reply_requested: bool,
}

const XLOG_DATA_TAG: u8 = b'w';
const KEEPALIVE_TAG: u8 = b'k';
const STATUS_UPDATE_TAG: u8 = b'r';
/// Tag + wal_start + wal_end + server_time.
const XLOG_DATA_HEADER_LEN: usize = 1 + 8 + 8 + 8;
/// Tag + wal_end + server_time + reply flag.
const KEEPALIVE_LEN: usize = 1 + 8 + 8 + 1;
/// Tag + write + flush + apply + client_time + reply flag.
const STATUS_UPDATE_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;

impl ReplicationMessage {
    /// Decodes one server→client CopyData payload.
    pub fn decode(buf: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(&buf)?;
        match r.tag {
            XLOG_DATA_TAG => {
                let wal_start = Lsn(r.u64()?);
                let wal_end = Lsn(r.u64()?);
                let server_time = PgTimestamp(r.i64()?);
                let data = buf.slice(XLOG_DATA_HEADER_LEN..);
                Ok(ReplicationMessage::XLogData(XLogData {
                    wal_start,
                    wal_end,
                    server_time,
                    data,
                }))
            }
            KEEPALIVE_TAG => {
                let wal_end = Lsn(r.u64()?);
                let server_time = PgTimestamp(r.i64()?);
                let reply_requested = r.flag()?;
                r.finish()?;
                Ok(ReplicationMessage::PrimaryKeepalive(PrimaryKeepalive {
                    wal_end,
                    server_time,
                    reply_requested,
                }))
            }
            _ => Err(r.error(0, WireErrorKind::UnknownTag)),
        }
    }

    /// Appends the encoded payload to `buf` (the server side, for tests and fakes).
    pub fn encode_into(&self, buf: &mut BytesMut) {
        match self {
            ReplicationMessage::XLogData(x) => {
                buf.reserve(XLOG_DATA_HEADER_LEN + x.data.len());
                buf.put_u8(XLOG_DATA_TAG);
                buf.put_u64(x.wal_start.0);
                buf.put_u64(x.wal_end.0);
                buf.put_i64(x.server_time.0);
                buf.put_slice(&x.data);
            }
            ReplicationMessage::PrimaryKeepalive(k) => {
                buf.reserve(KEEPALIVE_LEN);
                buf.put_u8(KEEPALIVE_TAG);
                buf.put_u64(k.wal_end.0);
                buf.put_i64(k.server_time.0);
                buf.put_u8(u8::from(k.reply_requested));
            }
        }
    }

    /// The encoded payload.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode_into(&mut buf);
        buf.freeze()
    }
}

impl StandbyStatusUpdate {
    /// Appends the encoded payload to `buf`.
    pub fn encode_into(&self, buf: &mut BytesMut) {
        buf.reserve(STATUS_UPDATE_LEN);
        buf.put_u8(STATUS_UPDATE_TAG);
        buf.put_u64(self.write_lsn.0);
        buf.put_u64(self.flush_lsn.0);
        buf.put_u64(self.apply_lsn.0);
        buf.put_i64(self.client_time.0);
        buf.put_u8(u8::from(self.reply_requested));
    }

    /// The encoded payload: always 34 bytes.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(STATUS_UPDATE_LEN);
        self.encode_into(&mut buf);
        buf.freeze()
    }

    /// Decodes a status update (the server side, for tests and fakes).
    pub fn decode(buf: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(&buf)?;
        if r.tag != STATUS_UPDATE_TAG {
            return Err(r.error(0, WireErrorKind::UnknownTag));
        }
        let update = StandbyStatusUpdate {
            write_lsn: Lsn(r.u64()?),
            flush_lsn: Lsn(r.u64()?),
            apply_lsn: Lsn(r.u64()?),
            client_time: PgTimestamp(r.i64()?),
            reply_requested: r.flag()?,
        };
        r.finish()?;
        Ok(update)
    }
}

/// Why a replication CopyData payload could not be decoded.
///
/// Displays as, for example, "replication Primary keepalive ('k') message: unexpected end of
/// data at offset 9: need 8 more bytes".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    /// The payload's first byte, `None` when it was empty.
    pub tag: Option<u8>,
    /// Byte offset into the payload (0 is the tag) where the problem was found.
    pub offset: usize,
    /// What was wrong.
    pub kind: WireErrorKind,
}

/// What was wrong with a replication CopyData payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireErrorKind {
    /// The payload had no bytes at all.
    Empty,
    /// The tag is not one this decoder handles.
    UnknownTag,
    /// The payload ended early: `needed` more bytes were required.
    UnexpectedEof { needed: usize },
    /// `count` bytes left over after a complete fixed-size message.
    TrailingBytes { count: usize },
    /// A reply-requested flag other than 0 or 1.
    InvalidFlag { value: u8 },
}

impl std::error::Error for WireError {}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replication {} message: ", TagName(self.tag))?;
        let at = self.offset;
        match self.kind {
            WireErrorKind::Empty => write!(f, "empty payload"),
            WireErrorKind::UnknownTag => write!(f, "unknown tag at offset {at}"),
            WireErrorKind::UnexpectedEof { needed } => write!(
                f,
                "unexpected end of data at offset {at}: need {needed} more bytes"
            ),
            WireErrorKind::TrailingBytes { count } => write!(
                f,
                "{count} trailing bytes at offset {at} after a complete message"
            ),
            WireErrorKind::InvalidFlag { value } => write!(
                f,
                "invalid reply-requested flag {value} at offset {at} (expected 0 or 1)"
            ),
        }
    }
}

struct TagName(Option<u8>);

impl fmt::Display for TagName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            None => return f.write_str("CopyData"),
            Some(XLOG_DATA_TAG) => "XLogData",
            Some(KEEPALIVE_TAG) => "Primary keepalive",
            Some(STATUS_UPDATE_TAG) => "Standby status update",
            Some(b) if b.is_ascii_graphic() => return write!(f, "CopyData '{}'", b as char),
            Some(b) => return write!(f, "CopyData 0x{b:02x}"),
        };
        write!(f, "{name} ('{}')", self.0.unwrap_or(b'?') as char)
    }
}

/// A bounds-checked big-endian reader over one payload.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    tag: u8,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Result<Self, WireError> {
        let Some(&tag) = buf.first() else {
            return Err(WireError {
                tag: None,
                offset: 0,
                kind: WireErrorKind::Empty,
            });
        };
        Ok(Reader { buf, pos: 1, tag })
    }

    fn error(&self, offset: usize, kind: WireErrorKind) -> WireError {
        WireError {
            tag: Some(self.tag),
            offset,
            kind,
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        match rest.get(..N).and_then(|s| <[u8; N]>::try_from(s).ok()) {
            Some(a) => {
                self.pos += N;
                Ok(a)
            }
            None => Err(self.error(
                self.pos,
                WireErrorKind::UnexpectedEof {
                    needed: N - rest.len(),
                },
            )),
        }
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.array().map(u64::from_be_bytes)
    }

    fn i64(&mut self) -> Result<i64, WireError> {
        self.array().map(i64::from_be_bytes)
    }

    fn flag(&mut self) -> Result<bool, WireError> {
        let at = self.pos;
        match self.array::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(self.error(at, WireErrorKind::InvalidFlag { value })),
        }
    }

    fn finish(&self) -> Result<(), WireError> {
        match self.buf.len().saturating_sub(self.pos) {
            0 => Ok(()),
            count => Err(self.error(self.pos, WireErrorKind::TrailingBytes { count })),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Byte fixtures from the layouts in "Streaming Replication Protocol" (`START_REPLICATION`).

    use super::*;
    use proptest::prelude::*;

    /// 0/16B3748
    const LSN_A: [u8; 8] = [0, 0, 0, 0, 0x01, 0x6b, 0x37, 0x48];
    /// 0/16B3778
    const LSN_B: [u8; 8] = [0, 0, 0, 0, 0x01, 0x6b, 0x37, 0x78];
    /// 2024-01-01T00:00:00Z in microseconds since 2000-01-01.
    const TS: [u8; 8] = [0x00, 0x02, 0xb0, 0xd5, 0xd4, 0xe9, 0x40, 0x00];
    const TS_VALUE: PgTimestamp = PgTimestamp(757_382_400_000_000);

    fn cat(parts: &[&[u8]]) -> Bytes {
        Bytes::from(parts.concat())
    }

    fn xlog_fixture() -> (Bytes, ReplicationMessage) {
        // Byte1('w') Int64 wal_start Int64 wal_end Int64 server_time Byte(n) data
        let bytes = cat(&[b"w", &LSN_A, &LSN_B, &TS, b"B\x00payload"]);
        let msg = ReplicationMessage::XLogData(XLogData {
            wal_start: Lsn(0x16b3748),
            wal_end: Lsn(0x16b3778),
            server_time: TS_VALUE,
            data: Bytes::from_static(b"B\x00payload"),
        });
        (bytes, msg)
    }

    fn keepalive_fixture() -> (Bytes, ReplicationMessage) {
        // Byte1('k') Int64 wal_end Int64 server_time Byte1 reply_requested
        let bytes = cat(&[b"k", &LSN_B, &TS, &[1]]);
        let msg = ReplicationMessage::PrimaryKeepalive(PrimaryKeepalive {
            wal_end: Lsn(0x16b3778),
            server_time: TS_VALUE,
            reply_requested: true,
        });
        (bytes, msg)
    }

    #[test]
    fn server_messages_decode_from_documented_layouts() {
        for (bytes, msg) in [xlog_fixture(), keepalive_fixture()] {
            assert_eq!(ReplicationMessage::decode(bytes.clone()), Ok(msg.clone()));
            assert_eq!(msg.encode(), bytes);
        }
        // XLogData data is a slice of the input, and may be empty.
        let (bytes, _) = xlog_fixture();
        let Ok(ReplicationMessage::XLogData(x)) = ReplicationMessage::decode(bytes.clone()) else {
            panic!("not XLogData");
        };
        assert_eq!(x.data.as_ptr(), bytes[25..].as_ptr());
        let empty = ReplicationMessage::decode(cat(&[b"w", &LSN_A, &LSN_B, &TS])).unwrap();
        assert!(matches!(empty, ReplicationMessage::XLogData(x) if x.data.is_empty()));
    }

    #[test]
    fn standby_status_update_has_the_documented_layout() {
        let update = StandbyStatusUpdate {
            write_lsn: Lsn(0x16b3778),
            flush_lsn: Lsn(0x16b3748),
            apply_lsn: Lsn(0x16b3748),
            client_time: TS_VALUE,
            reply_requested: false,
        };
        // Byte1('r') Int64 write Int64 flush Int64 apply Int64 client_time Byte1 reply_requested
        let bytes = cat(&[b"r", &LSN_B, &LSN_A, &LSN_A, &TS, &[0]]);
        assert_eq!(update.encode(), bytes);
        assert_eq!(bytes.len(), 34);
        assert_eq!(StandbyStatusUpdate::decode(bytes), Ok(update));
    }

    #[test]
    fn truncated_and_hostile_payloads_are_errors() {
        for (bytes, _) in [xlog_fixture(), keepalive_fixture()] {
            let header = if bytes[0] == b'w' { 25 } else { bytes.len() };
            for len in 0..header {
                let e = ReplicationMessage::decode(bytes.slice(..len)).unwrap_err();
                assert!(e.offset <= len);
            }
        }
        let status = cat(&[b"r", &LSN_B, &LSN_A, &LSN_A, &TS, &[0]]);
        for len in 0..status.len() {
            assert!(StandbyStatusUpdate::decode(status.slice(..len)).is_err());
        }
        let e = ReplicationMessage::decode(Bytes::new()).unwrap_err();
        assert_eq!(e.kind, WireErrorKind::Empty);
        let e = ReplicationMessage::decode(cat(&[b"x", &[0; 30]])).unwrap_err();
        assert_eq!((e.tag, e.kind), (Some(b'x'), WireErrorKind::UnknownTag));
        let e = ReplicationMessage::decode(cat(&[b"k", &LSN_B, &TS, &[2]])).unwrap_err();
        assert_eq!(
            (e.offset, e.kind),
            (17, WireErrorKind::InvalidFlag { value: 2 })
        );
        let e = ReplicationMessage::decode(cat(&[b"k", &LSN_B, &TS, &[0, 0]])).unwrap_err();
        assert_eq!(
            (e.offset, e.kind),
            (18, WireErrorKind::TrailingBytes { count: 1 })
        );
        let e = StandbyStatusUpdate::decode(cat(&[b"k", &LSN_B, &TS, &[0]])).unwrap_err();
        assert_eq!(e.kind, WireErrorKind::UnknownTag);
    }

    #[test]
    fn errors_read_well() {
        let e = ReplicationMessage::decode(cat(&[b"k", &LSN_B])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "replication Primary keepalive ('k') message: unexpected end of data at offset 9: need 8 more bytes"
        );
        let e = ReplicationMessage::decode(cat(&[b"?"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "replication CopyData '?' message: unknown tag at offset 0"
        );
        let e = ReplicationMessage::decode(Bytes::new()).unwrap_err();
        assert_eq!(e.to_string(), "replication CopyData message: empty payload");
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_never_panic_and_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..48)) {
            let bytes = Bytes::from(bytes);
            if let Ok(m) = ReplicationMessage::decode(bytes.clone()) {
                prop_assert_eq!(m.encode(), bytes.clone());
            }
            if let Ok(u) = StandbyStatusUpdate::decode(bytes.clone()) {
                prop_assert_eq!(u.encode(), bytes);
            }
        }

        #[test]
        fn status_update_round_trips(w in any::<u64>(), f in any::<u64>(), a in any::<u64>(), t in any::<i64>(), r in any::<bool>()) {
            let u = StandbyStatusUpdate { write_lsn: Lsn(w), flush_lsn: Lsn(f), apply_lsn: Lsn(a), client_time: PgTimestamp(t), reply_requested: r };
            prop_assert_eq!(StandbyStatusUpdate::decode(u.encode()), Ok(u));
        }

    }
}
