//! The outer framing of PostgreSQL's frontend/backend protocol as the replication stream uses
//! it, as a pure codec: which bytes are one message, and what the COPY messages hold.
//!
//! Every backend message after startup is framed the same way (PostgreSQL documentation,
//! "Message Formats"):
//!
//! ```text
//! any message          Byte1 tag  Int32 length (counts itself, not the tag)  Byte(length - 4) body
//! CopyData             'd'  Byte(n) data          (during COPY BOTH: a replication message, see [`crate::wire`])
//! CopyDone             'c'  (no body)
//! CopyBothResponse     'W'  Int8 format  Int16 columns  Int16[columns] column formats
//! ```
//!
//! Two steps, kept apart as in mini-redis's `frame.rs`: [`split`] answers "is a whole message
//! buffered?" and cuts it off the read buffer (a zero-copy split, never an allocation sized by
//! the wire); [`StreamFrame::decode`] then says what the message is. The connection hands the
//! messages this module does not know ([`StreamFrame::Other`]: authentication, ErrorResponse,
//! DataRow, ...) to `postgres-protocol`, which parses all of those but not CopyBothResponse.
//!
//! Hostile bytes never panic: a negative or too small length is a [`FrameError`] naming the tag,
//! and so is a COPY message whose body does not match its layout. The encoders write exactly
//! what the decoders read (`decode(encode(m)) == m`), for tests, fakes and the client's own
//! CopyData (standby status updates).

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

/// Tag byte plus the Int32 length.
pub const HEADER_LEN: usize = 5;
/// CopyData (both directions).
pub const COPY_DATA_TAG: u8 = b'd';
/// CopyDone (both directions).
pub const COPY_DONE_TAG: u8 = b'c';
/// CopyBothResponse (backend).
pub const COPY_BOTH_RESPONSE_TAG: u8 = b'W';

/// One whole message cut off a read buffer: its tag, and the message with its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    tag: u8,
    message: BytesMut,
}

impl RawFrame {
    /// The message's first byte.
    pub fn tag(&self) -> u8 {
        self.tag
    }

    /// The body: everything after the tag and length.
    pub fn body(&self) -> &[u8] {
        &self.message[HEADER_LEN..]
    }

    /// The whole message, header included (what `postgres_protocol::message::backend::Message::parse`
    /// reads).
    pub fn into_message(self) -> BytesMut {
        self.message
    }

    /// The body, zero-copy.
    pub fn into_body(mut self) -> Bytes {
        self.message.split_off(HEADER_LEN).freeze()
    }
}

/// The length of the whole message at the start of `buf` (tag included), once its header is
/// buffered: `Ok(None)` while fewer than [`HEADER_LEN`] bytes are there. Lets a reader reserve
/// room for a large message before it has arrived.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(&[tag, a, b, c, d]) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let length = i32::from_be_bytes([a, b, c, d]);
    match usize::try_from(length) {
        Ok(len) if len >= 4 => Ok(Some(len + 1)),
        _ => Err(FrameError {
            tag,
            kind: FrameErrorKind::InvalidLength { length },
        }),
    }
}

/// A read buffer's chunks hold at least this many bytes.
pub const READ_CHUNK: usize = 64 * 1024;
/// Less free room than this, with no message to finish, and the next read goes to a new chunk:
/// a smaller read is not worth its system call.
pub const MIN_READ: usize = 4 * 1024;
/// A new chunk holds this many messages of the size being read, so that one straddles a
/// chunk's end (and is copied) about once per this many...
pub const MESSAGES_PER_CHUNK: usize = 16;
/// ...up to this size: a larger message gets a chunk of exactly its size.
pub const MAX_CHUNK: usize = 1024 * 1024;

/// What a read buffer needs before its next read, when it holds `buffered` bytes that are not a
/// whole message (the start of one, or none) and has room for `capacity` bytes in all; `total`
/// is the partial message's whole length once its header is in ([`frame_len`]). `None`: read
/// where there is room. `Some(n)`: reserve `n` more bytes first (`BytesMut::reserve`), which
/// moves the buffered bytes to a new chunk of [`MESSAGES_PER_CHUNK`] messages of this one's size
/// (at least [`READ_CHUNK`], at most [`MAX_CHUNK`] unless the message is larger).
///
/// Moving copies the buffered bytes, so a buffer moves only when it must: when the rest of the
/// message does not fit, or nothing is left to finish and the room left is under
/// [`MIN_READ`]. A message of `L` bytes then straddles a chunk's end about once per chunk, and
/// half of it on average is copied: `L / (2 * MESSAGES_PER_CHUNK)` a message, ~3% of the
/// stream's bytes (5% measured on 16 KB rows, where moving at every partial message into
/// 64 KiB chunks copied 28%).
pub fn room_for(buffered: usize, capacity: usize, total: Option<usize>) -> Option<usize> {
    let spare = capacity.saturating_sub(buffered);
    let fits = match total {
        Some(total) => total.saturating_sub(buffered) <= spare,
        None => spare >= MIN_READ,
    };
    if fits {
        return None;
    }
    let chunk = match total {
        // More than `buffered`: the rest did not fit.
        Some(total) => total
            .saturating_mul(MESSAGES_PER_CHUNK)
            .clamp(READ_CHUNK, MAX_CHUNK)
            .max(total),
        // (a header is 5 bytes, so no more than 4 are buffered while its length is unknown)
        None => READ_CHUNK.max(buffered.saturating_add(MIN_READ)),
    };
    Some(chunk - buffered)
}

/// Cuts the first whole message off `buf`; `Ok(None)` (and `buf` untouched) while it is not all
/// buffered. Cancel-safe by construction: nothing is consumed until a message is complete.
pub fn split(buf: &mut BytesMut) -> Result<Option<RawFrame>, FrameError> {
    match frame_len(buf)? {
        Some(total) if buf.len() >= total => Ok(Some(RawFrame {
            tag: buf[0],
            message: buf.split_to(total),
        })),
        _ => Ok(None),
    }
}

/// What a message means to the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFrame {
    /// CopyData: the payload, a zero-copy slice of the read buffer.
    CopyData(Bytes),
    /// CopyDone: the other side ended the copy.
    CopyDone,
    /// CopyBothResponse: streaming started.
    CopyBothResponse(CopyBothResponse),
    /// Any other message, left whole for a general protocol parser.
    Other(RawFrame),
}

/// The body of CopyBothResponse. For `START_REPLICATION` PostgreSQL sends format 0 and no
/// columns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyBothResponse {
    /// Overall format: 0 textual, 1 binary.
    pub format: u8,
    /// Per-column format codes (0 text, 1 binary).
    pub column_formats: Vec<u16>,
}

impl StreamFrame {
    /// Says what a whole message is, checking the layout of the COPY messages.
    pub fn decode(raw: RawFrame) -> Result<StreamFrame, FrameError> {
        let err = |kind| Err(FrameError { tag: raw.tag, kind });
        match raw.tag {
            COPY_DATA_TAG => Ok(StreamFrame::CopyData(raw.into_body())),
            COPY_DONE_TAG => match raw.body().len() {
                0 => Ok(StreamFrame::CopyDone),
                count => err(FrameErrorKind::TrailingBytes { count }),
            },
            COPY_BOTH_RESPONSE_TAG => {
                copy_both_response(raw.body()).map_err(|kind| FrameError { tag: raw.tag, kind })
            }
            _ => Ok(StreamFrame::Other(raw)),
        }
    }

    /// Appends the message, header included.
    pub fn encode_into(&self, buf: &mut BytesMut) {
        match self {
            StreamFrame::CopyData(data) => encode_copy_data(data, buf),
            StreamFrame::CopyDone => put_header(buf, COPY_DONE_TAG, 0),
            StreamFrame::CopyBothResponse(r) => {
                put_header(buf, COPY_BOTH_RESPONSE_TAG, 3 + 2 * r.column_formats.len());
                buf.put_u8(r.format);
                buf.put_u16(u16::try_from(r.column_formats.len()).unwrap_or(u16::MAX));
                for f in &r.column_formats {
                    buf.put_u16(*f);
                }
            }
            StreamFrame::Other(raw) => buf.put_slice(&raw.message),
        }
    }

    /// The encoded message.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode_into(&mut buf);
        buf.freeze()
    }
}

/// Appends one CopyData message carrying `payload` (the client's standby status updates).
pub fn encode_copy_data(payload: &[u8], buf: &mut BytesMut) {
    put_header(buf, COPY_DATA_TAG, payload.len());
    buf.put_slice(payload);
}

fn put_header(buf: &mut BytesMut, tag: u8, body_len: usize) {
    buf.reserve(HEADER_LEN + body_len);
    buf.put_u8(tag);
    // A body over 2 GiB cannot be sent; saturating keeps the encoder total (no caller sends one).
    buf.put_i32(i32::try_from(body_len + 4).unwrap_or(i32::MAX));
}

fn copy_both_response(body: &[u8]) -> Result<StreamFrame, FrameErrorKind> {
    let eof = |offset: usize, needed: usize| FrameErrorKind::UnexpectedEof { offset, needed };
    let Some((&format, rest)) = body.split_first() else {
        return Err(eof(0, 3));
    };
    if format > 1 {
        return Err(FrameErrorKind::InvalidFormat {
            offset: 0,
            value: u16::from(format),
        });
    }
    let Some(&[hi, lo]) = rest.get(..2) else {
        return Err(eof(1, 2 - rest.len()));
    };
    let columns = usize::from(u16::from_be_bytes([hi, lo]));
    let formats = &rest[2..];
    if formats.len() < 2 * columns {
        return Err(eof(3 + formats.len(), 2 * columns - formats.len()));
    }
    if formats.len() > 2 * columns {
        return Err(FrameErrorKind::TrailingBytes {
            count: formats.len() - 2 * columns,
        });
    }
    let mut column_formats = Vec::with_capacity(columns);
    for (i, pair) in formats.chunks_exact(2).enumerate() {
        let value = u16::from_be_bytes([pair[0], pair[1]]);
        if value > 1 {
            return Err(FrameErrorKind::InvalidFormat {
                offset: 3 + 2 * i,
                value,
            });
        }
        column_formats.push(value);
    }
    Ok(StreamFrame::CopyBothResponse(CopyBothResponse {
        format,
        column_formats,
    }))
}

/// Why bytes from the server are not a well-framed message.
///
/// Displays as, for example, "message 'd' from the server: invalid length -1 (at least 4)".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {} from the server: {kind}", TagName(*.tag))]
pub struct FrameError {
    /// The message's tag byte.
    pub tag: u8,
    /// What was wrong.
    pub kind: FrameErrorKind,
}

/// What was wrong with a message's framing or COPY body. Offsets count from the body's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameErrorKind {
    /// The Int32 length is negative or below 4 (it counts itself).
    InvalidLength { length: i32 },
    /// The body ended early: `needed` more bytes were required at `offset`.
    UnexpectedEof { offset: usize, needed: usize },
    /// `count` bytes left over after a complete body.
    TrailingBytes { count: usize },
    /// A format code other than 0 (text) or 1 (binary).
    InvalidFormat { offset: usize, value: u16 },
}

impl fmt::Display for FrameErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameErrorKind::InvalidLength { length } => {
                write!(f, "invalid length {length} (at least 4)")
            }
            FrameErrorKind::UnexpectedEof { offset, needed } => {
                write!(f, "body ends at offset {offset}: need {needed} more bytes")
            }
            FrameErrorKind::TrailingBytes { count } => {
                write!(f, "{count} trailing bytes after a complete body")
            }
            FrameErrorKind::InvalidFormat { offset, value } => write!(
                f,
                "invalid format code {value} at offset {offset} (expected 0 or 1)"
            ),
        }
    }
}

struct TagName(u8);

impl fmt::Display for TagName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            b if b.is_ascii_graphic() => write!(f, "'{}'", b as char),
            b => write!(f, "0x{b:02x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Byte fixtures from "Message Formats" (CopyData, CopyDone, CopyBothResponse).

    use super::*;
    use proptest::prelude::*;

    fn buf(parts: &[&[u8]]) -> BytesMut {
        BytesMut::from(&parts.concat()[..])
    }

    /// (bytes, what they decode to), each a whole message.
    fn fixtures() -> Vec<(BytesMut, StreamFrame)> {
        vec![
            // Byte1('d') Int32(len) Byte(n): a keepalive payload of 18 bytes.
            (
                buf(&[b"d", &[0, 0, 0, 22], b"k", &[7; 16], &[1]]),
                StreamFrame::CopyData(Bytes::from([&b"k"[..], &[7; 16], &[1]].concat())),
            ),
            // An empty CopyData.
            (
                buf(&[b"d", &[0, 0, 0, 4]]),
                StreamFrame::CopyData(Bytes::new()),
            ),
            // Byte1('c') Int32(4)
            (buf(&[b"c", &[0, 0, 0, 4]]), StreamFrame::CopyDone),
            // Byte1('W') Int32(7) Int8(0) Int16(0): what START_REPLICATION answers.
            (
                buf(&[b"W", &[0, 0, 0, 7], &[0], &[0, 0]]),
                StreamFrame::CopyBothResponse(CopyBothResponse::default()),
            ),
            // Binary overall, two columns (text, binary).
            (
                buf(&[b"W", &[0, 0, 0, 11], &[1], &[0, 2], &[0, 0], &[0, 1]]),
                StreamFrame::CopyBothResponse(CopyBothResponse {
                    format: 1,
                    column_formats: vec![0, 1],
                }),
            ),
        ]
    }

    #[test]
    fn copy_messages_decode_from_documented_layouts_and_re_encode() {
        for (bytes, want) in fixtures() {
            let mut read = bytes.clone();
            let raw = split(&mut read).unwrap().expect("a whole message");
            assert!(read.is_empty());
            assert_eq!(StreamFrame::decode(raw).unwrap(), want);
            assert_eq!(want.encode(), bytes.freeze());
        }
    }

    #[test]
    fn copy_data_is_a_zero_copy_slice_of_the_read_buffer() {
        let mut read = buf(&[b"d", &[0, 0, 0, 9], b"hello", b"c", &[0, 0, 0, 4]]);
        let start = read.as_ptr();
        let raw = split(&mut read).unwrap().unwrap();
        let StreamFrame::CopyData(data) = StreamFrame::decode(raw).unwrap() else {
            panic!("not CopyData");
        };
        assert_eq!(&data[..], b"hello");
        assert_eq!(data.as_ptr(), start.wrapping_add(HEADER_LEN));
        // The next message stays buffered.
        assert_eq!(&read[..], b"c\0\0\0\x04");
    }

    #[test]
    fn every_fixture_truncated_at_every_offset_waits_and_never_panics() {
        for (bytes, _) in fixtures() {
            for len in 0..bytes.len() {
                let mut read = BytesMut::from(&bytes[..len]);
                assert_eq!(split(&mut read), Ok(None), "{bytes:?} cut at {len}");
                assert_eq!(read.len(), len, "nothing consumed");
                let want = if len < HEADER_LEN {
                    None
                } else {
                    Some(bytes.len())
                };
                assert_eq!(frame_len(&read), Ok(want));
            }
        }
    }

    #[test]
    fn every_copy_body_truncated_at_every_offset_is_an_error() {
        // The same bodies reframed with the truncated length: a whole message whose body is short.
        for (bytes, msg) in fixtures() {
            if matches!(msg, StreamFrame::CopyData(_) | StreamFrame::CopyDone) {
                continue; // any CopyData body is valid; CopyDone has none
            }
            let body = &bytes[HEADER_LEN..];
            for len in 0..body.len() {
                let mut read = BytesMut::new();
                put_header(&mut read, bytes[0], len);
                read.put_slice(&body[..len]);
                let raw = split(&mut read).unwrap().unwrap();
                let e = StreamFrame::decode(raw).unwrap_err();
                assert!(
                    matches!(e.kind, FrameErrorKind::UnexpectedEof { .. }),
                    "{e} at {len}"
                );
            }
        }
    }

    #[test]
    fn hostile_headers_and_bodies_are_errors_that_name_the_tag() {
        for length in [i32::MIN, -1, 0, 3] {
            let mut read = buf(&[b"d", &length.to_be_bytes()]);
            let e = split(&mut read).unwrap_err();
            assert_eq!(e.kind, FrameErrorKind::InvalidLength { length });
            assert_eq!(read.len(), HEADER_LEN, "nothing consumed");
        }
        let e = split(&mut buf(&[b"d", &(-1i32).to_be_bytes()])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "message 'd' from the server: invalid length -1 (at least 4)"
        );
        let decode = |bytes: BytesMut| {
            let mut read = bytes;
            StreamFrame::decode(split(&mut read).unwrap().unwrap())
        };
        let e = decode(buf(&[b"c", &[0, 0, 0, 5], &[0]])).unwrap_err();
        assert_eq!(e.kind, FrameErrorKind::TrailingBytes { count: 1 });
        let e = decode(buf(&[b"W", &[0, 0, 0, 7], &[2], &[0, 0]])).unwrap_err();
        assert_eq!(
            e.kind,
            FrameErrorKind::InvalidFormat {
                offset: 0,
                value: 2
            }
        );
        let e = decode(buf(&[b"W", &[0, 0, 0, 9], &[0], &[0, 1], &[0, 9]])).unwrap_err();
        assert_eq!(
            e.kind,
            FrameErrorKind::InvalidFormat {
                offset: 3,
                value: 9
            }
        );
        assert_eq!(
            e.to_string(),
            "message 'W' from the server: invalid format code 9 at offset 3 (expected 0 or 1)"
        );
        let e = decode(buf(&[b"W", &[0, 0, 0, 8], &[0], &[0, 0], &[0]])).unwrap_err();
        assert_eq!(e.kind, FrameErrorKind::TrailingBytes { count: 1 });
        // Other messages pass through whole, for postgres-protocol.
        let other = buf(&[b"Z", &[0, 0, 0, 5], b"I"]);
        let StreamFrame::Other(raw) = decode(other.clone()).unwrap() else {
            panic!("not Other");
        };
        assert_eq!((raw.tag(), raw.body()), (b'Z', &b"I"[..]));
        assert_eq!(raw.into_message(), other);
    }

    fn stream_frame() -> impl Strategy<Value = StreamFrame> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64)
                .prop_map(|d| StreamFrame::CopyData(Bytes::from(d))),
            Just(StreamFrame::CopyDone),
            (0u8..2, prop::collection::vec(0u16..2, 0..6)).prop_map(|(format, column_formats)| {
                StreamFrame::CopyBothResponse(CopyBothResponse {
                    format,
                    column_formats,
                })
            }),
            (b'A'..=b'Z', prop::collection::vec(any::<u8>(), 0..16))
                .prop_filter("not a COPY tag", |(t, _)| *t != COPY_BOTH_RESPONSE_TAG)
                .prop_map(|(tag, body)| {
                    let mut message = BytesMut::new();
                    put_header(&mut message, tag, body.len());
                    message.put_slice(&body);
                    StreamFrame::Other(RawFrame { tag, message })
                }),
        ]
    }

    proptest! {
        #[test]
        fn a_stream_of_frames_round_trips_in_any_chunking(
            frames in prop::collection::vec(stream_frame(), 0..8),
            chunk in 1usize..40,
        ) {
            let mut wire = BytesMut::new();
            for f in &frames {
                f.encode_into(&mut wire);
            }
            // Fed in chunks, as reads from a socket arrive.
            let mut read = BytesMut::new();
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                read.extend_from_slice(piece);
                while let Some(raw) = split(&mut read).unwrap() {
                    got.push(StreamFrame::decode(raw).unwrap());
                }
            }
            prop_assert!(read.is_empty());
            prop_assert_eq!(got, frames);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_what_decodes_re_encodes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let mut read = BytesMut::from(&bytes[..]);
            let mut consumed = 0;
            while let Ok(Some(raw)) = split(&mut read) {
                let len = raw.message.len();
                let original = &bytes[consumed..consumed + len];
                if let Ok(frame) = StreamFrame::decode(raw) {
                    prop_assert_eq!(&frame.encode()[..], original);
                }
                consumed += len;
            }
        }
    }

    /// A model of the read buffer under [`room_for`]: messages of the given sizes arrive in
    /// reads of the given sizes (each cut to the room left), whole messages are split off the
    /// front, and a reserve that moves copies what is buffered (a new chunk: the messages
    /// already split off still hold the old one). Returns (bytes copied, bytes read).
    fn copied_by_moves(sizes: &[usize], reads: &[usize]) -> (usize, usize) {
        let total_bytes: usize = sizes.iter().sum();
        let (mut capacity, mut buffered, mut arrived, mut copied) = (READ_CHUNK, 0, 0, 0);
        let mut next = 0; // the first message not yet split off
        let mut reads = reads.iter().cycle();
        while next < sizes.len() {
            // Split off every whole message.
            while next < sizes.len() && buffered >= sizes[next] {
                buffered -= sizes[next];
                capacity -= sizes[next];
                next += 1;
            }
            if next == sizes.len() {
                break;
            }
            let total = (buffered >= HEADER_LEN).then_some(sizes[next]);
            if let Some(more) = room_for(buffered, capacity, total) {
                assert!(
                    buffered + more >= total.unwrap_or(0),
                    "the message fits after the reserve"
                );
                assert!(buffered + more >= READ_CHUNK);
                copied += buffered;
                capacity = buffered + more;
            }
            let spare = capacity - buffered;
            assert!(spare > 0, "a read always has room");
            let n = (*reads.next().unwrap())
                .clamp(1, spare)
                .min(total_bytes - arrived);
            buffered += n;
            arrived += n;
        }
        (copied, total_bytes)
    }

    /// The most [`copied_by_moves`] may copy of `read` bytes of `size`-byte messages: a
    /// message straddles a chunk's end at most once per chunk, and a chunk holds
    /// [`MESSAGES_PER_CHUNK`] of them unless [`MAX_CHUNK`] caps it (or [`READ_CHUNK`] holds
    /// more); plus one message for the first chunk.
    fn most_copied(size: usize, read: usize) -> usize {
        let per_chunk = (MAX_CHUNK / size)
            .clamp(1, MESSAGES_PER_CHUNK)
            .max(READ_CHUNK / size);
        read / per_chunk + size
    }

    #[test]
    fn sixteen_kb_rows_copy_a_sixteenth_of_their_bytes_at_most() {
        // 16.9 KB CopyData messages (backlog-16k's rows), read whole-room at a time or in the
        // socket's odd sizes.
        let sizes = vec![16_918; 2_000];
        for reads in [&[usize::MAX][..], &[1_448, 65_483, 7, 20_000, 131_072]] {
            let (copied, read) = copied_by_moves(&sizes, reads);
            assert!(
                copied <= most_copied(sizes[0], read),
                "copied {copied} of {read} bytes with reads {reads:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn a_buffer_moves_rarely_and_always_has_room(
            size in HEADER_LEN..300_000usize,
            count in 1usize..200,
            reads in prop::collection::vec(1usize..200_000, 1..8),
        ) {
            let sizes = vec![size; count];
            let (copied, read) = copied_by_moves(&sizes, &reads);
            prop_assert!(
                copied <= most_copied(size, read),
                "copied {} of {} bytes of {}-byte messages", copied, read, size
            );
        }

        #[test]
        fn room_for_answers_with_room(
            buffered in 0usize..2_000_000,
            capacity in 0usize..2_000_000,
            total in prop::option::of(HEADER_LEN..4_000_000usize),
        ) {
            let capacity = capacity.max(buffered);
            // Never a panic, whatever the numbers.
            let _ = room_for(buffered, capacity, total);
            // The states a reader meets: no length before the header is in, and a partial
            // message shorter than its length.
            let total = total.filter(|&t| t > buffered && buffered >= HEADER_LEN);
            let buffered = if total.is_none() { buffered % HEADER_LEN } else { buffered };
            match room_for(buffered, capacity, total) {
                None => {
                    let spare = capacity - buffered;
                    prop_assert!(spare >= total.map_or(MIN_READ, |t| t - buffered));
                    prop_assert!(spare > 0);
                }
                Some(more) => {
                    prop_assert!(buffered + more >= total.unwrap_or(0));
                    prop_assert!(buffered + more >= READ_CHUNK);
                    prop_assert!(buffered + more <= MAX_CHUNK.max(total.unwrap_or(0)));
                }
            }
        }
    }
}
