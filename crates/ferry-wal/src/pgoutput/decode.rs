//! Decoding pgoutput messages: a bounds-checked reader, one function per message, and the
//! stream-state tracking [`Decoder`].

use bytes::Bytes;

use super::error::{DecodeError, DecodeErrorKind};
use super::*;

/// Decodes one pgoutput message.
///
/// `in_stream` says whether the message was received inside a stream block (between Stream
/// Start and Stream Stop, protocol version 2): there, Relation, Type, Insert, Update, Delete,
/// Truncate and Message carry an xid right after the tag. Use [`Decoder`] to track it.
pub fn decode(buf: Bytes, in_stream: bool) -> Result<PgOutputMessage, DecodeError> {
    let mut r = Reader::new(buf)?;
    let msg = match r.tag {
        tag::BEGIN => PgOutputMessage::Begin(Begin {
            final_lsn: r.lsn()?,
            commit_time: r.timestamp()?,
            xid: r.u32()?,
        }),
        tag::COMMIT => PgOutputMessage::Commit(Commit {
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_time: r.timestamp()?,
        }),
        tag::ORIGIN => PgOutputMessage::Origin(Origin {
            commit_lsn: r.lsn()?,
            name: r.string("origin name")?,
        }),
        tag::RELATION => PgOutputMessage::Relation(relation(&mut r, in_stream)?),
        tag::TYPE => PgOutputMessage::Type(Type {
            xid: r.stream_xid(in_stream)?,
            oid: r.u32()?,
            namespace: r.string("type namespace")?,
            name: r.string("type name")?,
        }),
        tag::INSERT => {
            let xid = r.stream_xid(in_stream)?;
            let relation_oid = r.u32()?;
            r.marker(b'N', "'N' (new tuple)")?;
            PgOutputMessage::Insert(Insert {
                xid,
                relation_oid,
                new: r.tuple()?,
            })
        }
        tag::UPDATE => PgOutputMessage::Update(Box::new(update(&mut r, in_stream)?)),
        tag::DELETE => {
            let xid = r.stream_xid(in_stream)?;
            let relation_oid = r.u32()?;
            let at = r.pos;
            let old = match r.u8()? {
                b'K' => OldTuple::Key(r.tuple()?),
                b'O' => OldTuple::Full(r.tuple()?),
                found => return Err(r.marker_error(at, "'K' or 'O' (old tuple)", found)),
            };
            PgOutputMessage::Delete(Box::new(Delete {
                xid,
                relation_oid,
                old,
            }))
        }
        tag::TRUNCATE => {
            let xid = r.stream_xid(in_stream)?;
            let (count_at, count) = r.count_i32()?;
            let options = r.u8()?;
            r.check_count(count_at, count, 4)?;
            let mut relation_oids = Vec::with_capacity(count);
            for _ in 0..count {
                relation_oids.push(r.u32()?);
            }
            PgOutputMessage::Truncate(Truncate {
                xid,
                options,
                relation_oids,
            })
        }
        tag::MESSAGE => {
            let xid = r.stream_xid(in_stream)?;
            let transactional = r.bool("message flags")?;
            PgOutputMessage::Message(LogicalMessage {
                xid,
                transactional,
                lsn: r.lsn()?,
                prefix: r.string("message prefix")?,
                content: r.counted_bytes()?,
            })
        }
        tag::STREAM_START => PgOutputMessage::StreamStart(StreamStart {
            xid: r.u32()?,
            first_segment: r.bool("first-segment flag")?,
        }),
        tag::STREAM_STOP => PgOutputMessage::StreamStop,
        tag::STREAM_COMMIT => PgOutputMessage::StreamCommit(StreamCommit {
            xid: r.u32()?,
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_time: r.timestamp()?,
        }),
        tag::STREAM_ABORT => PgOutputMessage::StreamAbort(StreamAbort {
            xid: r.u32()?,
            subxact_xid: r.u32()?,
        }),
        _ => return Err(r.error(0, DecodeErrorKind::UnknownTag)),
    };
    r.finish()?;
    Ok(msg)
}

fn relation(r: &mut Reader, in_stream: bool) -> Result<Relation, DecodeError> {
    let xid = r.stream_xid(in_stream)?;
    let oid = r.u32()?;
    let namespace = r.string("relation namespace")?;
    let name = r.string("relation name")?;
    let at = r.pos;
    let identity = r.u8()?;
    let replica_identity = ReplicaIdentity::from_byte(identity).ok_or_else(|| {
        r.error(
            at,
            DecodeErrorKind::InvalidValue {
                field: "replica identity",
                value: identity,
            },
        )
    })?;
    // Flags, an empty name's NUL, type oid and type modifier.
    let (count_at, count) = r.count_i16()?;
    r.check_count(count_at, count, 1 + 1 + 4 + 4)?;
    let mut columns = Vec::with_capacity(count);
    for _ in 0..count {
        columns.push(Column {
            flags: r.u8()?,
            name: r.string("column name")?,
            type_oid: r.u32()?,
            type_modifier: r.i32()?,
        });
    }
    Ok(Relation {
        xid,
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn update(r: &mut Reader, in_stream: bool) -> Result<Update, DecodeError> {
    let xid = r.stream_xid(in_stream)?;
    let relation_oid = r.u32()?;
    let at = r.pos;
    let old = match r.u8()? {
        b'K' => Some(OldTuple::Key(r.tuple()?)),
        b'O' => Some(OldTuple::Full(r.tuple()?)),
        b'N' => None,
        found => return Err(r.marker_error(at, "'K', 'O' or 'N'", found)),
    };
    if old.is_some() {
        r.marker(b'N', "'N' (new tuple)")?;
    }
    Ok(Update {
        xid,
        relation_oid,
        old,
        new: r.tuple()?,
    })
}

/// A pgoutput decoder that follows Stream Start / Stream Stop, so that messages inside a stream
/// block are decoded in their streamed form.
///
/// It rejects a Stream Start inside an open block and a Stream Stop outside one: either means
/// the decoder lost track of the stream, and guessing would misread an xid as a relation oid.
/// Call [`Decoder::reset`] when the replication connection is re-established.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    open_stream: Option<u32>,
}

impl Decoder {
    /// A decoder outside any stream block.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a stream block is open.
    pub fn in_stream(&self) -> bool {
        self.open_stream.is_some()
    }

    /// The xid of the open stream block, if any.
    pub fn stream_xid(&self) -> Option<u32> {
        self.open_stream
    }

    /// Forgets any open stream block.
    pub fn reset(&mut self) {
        self.open_stream = None;
    }

    /// Decodes one message in the current stream state, then updates the state.
    pub fn decode(&mut self, buf: Bytes) -> Result<PgOutputMessage, DecodeError> {
        let msg = decode(buf, self.in_stream())?;
        let state_error = |kind| DecodeError {
            tag: Some(msg.tag()),
            offset: 0,
            kind,
        };
        match (&msg, self.open_stream) {
            (PgOutputMessage::StreamStart(_), Some(open_xid)) => {
                return Err(state_error(DecodeErrorKind::StreamStartInsideStream {
                    open_xid,
                }))
            }
            (PgOutputMessage::StreamStart(s), None) => self.open_stream = Some(s.xid),
            (PgOutputMessage::StreamStop, None) => {
                return Err(state_error(DecodeErrorKind::StreamStopOutsideStream))
            }
            (PgOutputMessage::StreamStop, Some(_)) => self.open_stream = None,
            _ => {}
        }
        Ok(msg)
    }
}

/// Minimum encoded size of one tuple column: its kind byte.
const MIN_TUPLE_COLUMN_LEN: usize = 1;

/// The column of a TupleData at `pos` of `buf` and the position after it, or `None` if it is
/// not a whole, valid column (then [`Reader::column`] reads it again for the error). The common
/// case without the checked reads' error bookkeeping: a row's columns are most of a message.
#[inline]
fn column_at(buf: &[u8], pos: usize) -> Option<(Col, usize)> {
    let kind = *buf.get(pos)?;
    match kind {
        b'n' => Some((Col::Null, pos + 1)),
        b'u' => Some((Col::UnchangedToast, pos + 1)),
        b't' | b'b' => {
            let len: [u8; 4] = buf.get(pos + 1..pos + 5)?.try_into().ok()?;
            let len = usize::try_from(i32::from_be_bytes(len)).ok()?;
            let next = pos + 5 + len;
            if next > buf.len() {
                return None;
            }
            let start = u32::try_from(pos + 5).ok()?;
            let end = u32::try_from(next).ok()?;
            let col = if kind == b't' {
                Col::Text { start, end }
            } else {
                Col::Binary { start, end }
            };
            Some((col, next))
        }
        _ => None,
    }
}

/// A bounds-checked big-endian reader over one message. Every read checks the bytes left first;
/// the position only moves forward and never past the end.
struct Reader {
    buf: Bytes,
    pos: usize,
    tag: u8,
}

impl Reader {
    fn new(buf: Bytes) -> Result<Self, DecodeError> {
        let Some(&tag) = buf.first() else {
            return Err(DecodeError {
                tag: None,
                offset: 0,
                kind: DecodeErrorKind::Empty,
            });
        };
        Ok(Reader { buf, pos: 1, tag })
    }

    fn error(&self, offset: usize, kind: DecodeErrorKind) -> DecodeError {
        DecodeError {
            tag: Some(self.tag),
            offset,
            kind,
        }
    }

    fn marker_error(&self, offset: usize, expected: &'static str, found: u8) -> DecodeError {
        self.error(
            offset,
            DecodeErrorKind::UnexpectedMarker { expected, found },
        )
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes' range, or an end-of-data error at the current position.
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, DecodeError> {
        let remaining = self.remaining();
        if remaining < n {
            return Err(self.error(
                self.pos,
                DecodeErrorKind::UnexpectedEof {
                    needed: n - remaining,
                },
            ));
        }
        let range = self.pos..self.pos + n;
        self.pos += n;
        Ok(range)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let range = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[range]);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(|[b]| b)
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        self.array().map(i16::from_be_bytes)
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        self.array().map(i32::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        self.array().map(|b| Lsn(u64::from_be_bytes(b)))
    }

    fn timestamp(&mut self) -> Result<PgTimestamp, DecodeError> {
        self.array().map(|b| PgTimestamp(i64::from_be_bytes(b)))
    }

    /// The leading xid of a message in its streamed form.
    fn stream_xid(&mut self, in_stream: bool) -> Result<Option<u32>, DecodeError> {
        if in_stream {
            self.u32().map(Some)
        } else {
            Ok(None)
        }
    }

    /// A byte documented as 0 or 1.
    fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(self.error(at, DecodeErrorKind::InvalidValue { field, value })),
        }
    }

    fn marker(&mut self, expected: u8, description: &'static str) -> Result<(), DecodeError> {
        let at = self.pos;
        match self.u8()? {
            b if b == expected => Ok(()),
            found => Err(self.marker_error(at, description, found)),
        }
    }

    /// A NUL-terminated UTF-8 string.
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let at = self.pos;
        let rest = self.buf.get(at..).unwrap_or_default();
        let Some(len) = rest.iter().position(|&b| b == 0) else {
            // At least the terminating NUL is missing.
            let end = self.buf.len();
            return Err(self.error(end, DecodeErrorKind::UnexpectedEof { needed: 1 }));
        };
        let s = std::str::from_utf8(&rest[..len])
            .map_err(|_| self.error(at, DecodeErrorKind::InvalidUtf8 { field }))?
            .to_owned();
        self.pos = at + len + 1;
        Ok(s)
    }

    /// An Int32 length followed by that many bytes, as a zero-copy slice.
    fn counted_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let at = self.pos;
        let len = self.i32()?;
        let len = usize::try_from(len)
            .map_err(|_| self.error(at, DecodeErrorKind::NegativeLength { length: len }))?;
        let range = self.take(len)?;
        Ok(self.buf.slice(range))
    }

    fn count_i16(&mut self) -> Result<(usize, usize), DecodeError> {
        let at = self.pos;
        let n = self.i16()?;
        let count = usize::try_from(n).map_err(|_| {
            self.error(
                at,
                DecodeErrorKind::NegativeLength {
                    length: i32::from(n),
                },
            )
        })?;
        Ok((at, count))
    }

    fn count_i32(&mut self) -> Result<(usize, usize), DecodeError> {
        let at = self.pos;
        let n = self.i32()?;
        let count = usize::try_from(n)
            .map_err(|_| self.error(at, DecodeErrorKind::NegativeLength { length: n }))?;
        Ok((at, count))
    }

    /// Rejects a count whose items cannot fit in the bytes left, before anything is allocated.
    fn check_count(
        &self,
        count_at: usize,
        count: usize,
        min_item_len: usize,
    ) -> Result<(), DecodeError> {
        let remaining = self.remaining();
        if count.saturating_mul(min_item_len) > remaining {
            return Err(self.error(
                count_at,
                DecodeErrorKind::CountTooLarge {
                    count,
                    min_item_len,
                    remaining,
                },
            ));
        }
        Ok(())
    }

    /// TupleData: Int16 column count, then one kind byte (and for text/binary a counted value)
    /// per column. The values stay where they are: each is a range of the message's bytes.
    fn tuple(&mut self) -> Result<Tuple, DecodeError> {
        let (count_at, count) = self.count_i16()?;
        self.check_count(count_at, count, MIN_TUPLE_COLUMN_LEN)?;
        if u32::try_from(self.buf.len()).is_err() {
            return Err(self.error(
                0,
                DecodeErrorKind::MessageTooLarge {
                    len: self.buf.len(),
                },
            ));
        }
        let mut parts = super::spare::take(count);
        for _ in 0..count {
            let col = match column_at(&self.buf, self.pos) {
                Some((col, next)) => {
                    self.pos = next;
                    col
                }
                None => self.column()?,
            };
            parts.cols.push(col);
        }
        parts.data = self.buf.clone();
        Ok(Tuple::from_parts(parts))
    }

    /// One column of a TupleData, every read checked: the error for a column [`column_at`]
    /// could not read.
    #[cold]
    fn column(&mut self) -> Result<Col, DecodeError> {
        let at = self.pos;
        Ok(match self.u8()? {
            b'n' => Col::Null,
            b'u' => Col::UnchangedToast,
            b't' => {
                let (start, end) = self.counted_range()?;
                Col::Text { start, end }
            }
            b'b' => {
                let (start, end) = self.counted_range()?;
                Col::Binary { start, end }
            }
            kind => return Err(self.error(at, DecodeErrorKind::UnknownTupleKind { kind })),
        })
    }

    /// A counted value's range in the message (which [`Reader::tuple`] checked fits in `u32`).
    fn counted_range(&mut self) -> Result<(u32, u32), DecodeError> {
        let at = self.pos;
        let len = self.i32()?;
        let len = usize::try_from(len)
            .map_err(|_| self.error(at, DecodeErrorKind::NegativeLength { length: len }))?;
        let range = self.take(len)?;
        // In range: the message is at most `u32::MAX` bytes long.
        Ok((range.start as u32, range.end as u32))
    }

    fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(self.error(self.pos, DecodeErrorKind::TrailingBytes { count })),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Bytes that are often a column: a kind byte of the four (or another), then for a value a
    /// length that fits, overruns or is negative.
    fn column_bytes() -> impl Strategy<Value = Vec<u8>> {
        let kind = prop_oneof![Just(b'n'), Just(b'u'), Just(b't'), Just(b'b'), any::<u8>()];
        let len = prop_oneof![0i32..8, -3i32..0, any::<i32>()];
        (
            kind,
            len,
            prop::collection::vec(any::<u8>(), 0..12),
            0usize..6,
        )
            .prop_map(|(kind, len, data, cut)| {
                let mut b = vec![b'I', kind];
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&data);
                b.truncate(b.len().saturating_sub(cut).max(1));
                b
            })
    }

    proptest! {
        /// The unchecked read of a column agrees with the checked one wherever it reads one, and
        /// leaves to it every column the checked read refuses.
        #[test]
        fn a_column_read_without_checks_is_the_checked_read(bytes in column_bytes()) {
            let buf = Bytes::from(bytes);
            let mut r = Reader::new(buf.clone()).unwrap();
            let checked = r.column().map(|col| (col, r.pos));
            match (column_at(&buf, 1), checked) {
                (Some(fast), Ok(checked)) => prop_assert_eq!(fast, checked),
                (None, Err(_)) => {}
                (fast, checked) => prop_assert!(false, "unchecked {fast:?}, checked {checked:?}"),
            }
        }
    }
}
