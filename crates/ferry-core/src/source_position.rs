//! The source-position header pair (`route.position_headers`): where in its source's WAL a
//! record comes from, so that a consumer can drop the duplicates Ferry's at-least-once restarts
//! create by a high-water mark per (source, topic, partition), without storing event ids.
//!
//! - [`SOURCE_HEADER`] (`ferry-source`): the source's identity, `<system identifier>/<timeline>/<slot>`
//!   ([`source_id`]), e.g. `7312345678901234567/1/ferry`. One value for a whole session's stream;
//!   after a reconnect to a promoted standby the timeline, and so the value, changes.
//! - [`POSITION_HEADER`] (`ferry-position`): `<commit LSN>:<index>` ([`SourcePosition`]), e.g.
//!   `0/16B3748:3`: the commit LSN of the row's transaction (pgoutput Begin's `final_lsn`) as
//!   PostgreSQL prints a `pg_lsn` (`X/X`, upper-case hex, no padding), and the row's index among
//!   the transaction's outbox events in WAL order, from 0.
//!
//! **The index rule.** Every outbox event the reader hands the core counts: each row of every
//! configured table and each table-less outbox message, whatever becomes of it (produced,
//! dead-lettered, skipped by `route.on_error = "skip"` or `--skip-event`, or covered by an
//! exactly-once progress record). So the index of a row never depends on the routing
//! configuration or on a one-shot flag, and a replayed transaction gives every row the index its
//! first copy had; gaps in the indices a topic sees are rows that went elsewhere or nowhere. It
//! is the count the exactly-once progress record keeps (`Partial::events`), less one. Changing
//! which tables are relayed (a `[[tables]]` entry added) does change it.
//!
//! Positions order as `(commit_lsn, index)` ([`Ord`]): the order Ferry produces them in, since a
//! slot decodes transactions in commit order. Parsing is strict, the exact inverse of writing:
//! one spelling per position, so a consumer may compare header bytes it stored with new ones.

use std::fmt;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use ferry_pgtypes::Lsn;
use ferry_router::Header;

/// The source header's name. Defined beside the router's other header names (it checks that no
/// configured header takes it) and re-exported here.
pub use ferry_router::SOURCE_HEADER;

/// The position header's name (see [`SOURCE_HEADER`] for where it is defined).
pub use ferry_router::POSITION_HEADER;

/// Where a record sits in its source's WAL: the commit LSN of its transaction and its index
/// among the transaction's outbox events (from 0, counting every row of every configured table
/// and every outbox message, in WAL order; see the [module documentation](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourcePosition {
    pub commit_lsn: Lsn,
    pub index: u32,
}

/// The longest position written: `FFFFFFFF/FFFFFFFF:4294967295`.
pub const MAX_POSITION_LEN: usize = 8 + 1 + 8 + 1 + 10;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

impl SourcePosition {
    /// Reads a position as [`SourcePosition::write`] writes it, and nothing else: each LSN half
    /// 1 to 8 upper-case hex digits without leading zeros (`0` alone for zero), `:`, and the
    /// index in decimal without sign or leading zeros, at most `u32::MAX`.
    pub fn parse(value: &[u8]) -> Option<SourcePosition> {
        let slash = value.iter().position(|&b| b == b'/')?;
        let (hi, rest) = (&value[..slash], &value[slash + 1..]);
        let colon = rest.iter().position(|&b| b == b':')?;
        let (lo, index) = (&rest[..colon], &rest[colon + 1..]);
        let hi = hex_half(hi)?;
        let lo = hex_half(lo)?;
        Some(SourcePosition {
            commit_lsn: Lsn((u64::from(hi) << 32) | u64::from(lo)),
            index: decimal(index)?,
        })
    }

    /// Appends the position's text (at most [`MAX_POSITION_LEN`] bytes) to `out` in one put,
    /// without allocating (unless `out` must grow).
    pub fn write<B: BufMut + ?Sized>(&self, out: &mut B) {
        let mut buf = [0u8; MAX_POSITION_LEN];
        let mut n = put_hex(&mut buf, 0, (self.commit_lsn.0 >> 32) as u32);
        buf[n] = b'/';
        n = put_hex(&mut buf, n + 1, self.commit_lsn.0 as u32);
        buf[n] = b':';
        n = put_decimal(&mut buf, n + 1, self.index);
        out.put_slice(&buf[..n]);
    }
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = Vec::with_capacity(MAX_POSITION_LEN);
        self.write(&mut buf);
        // Only ASCII digits, letters, '/' and ':' are written.
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

/// Bytes of one block the position values are written into: about 150 positions share an
/// allocation, so a record's position costs no allocation of its own.
const ARENA_BYTES: usize = 4096;

/// Adds the two headers to the records of a relay core with `route.position_headers`.
///
/// The source's value is made once per session ([`Stamp::set_source`]) and shared by every
/// record (a reference count); each position is written into a shared block
/// ([`ARENA_BYTES`]) and split off it, so stamping a record allocates nothing: the router
/// reserved room for the two headers ([`ferry_router::Router::position_headers`]).
///
/// What it costs a row (`tests/bench.rs`, relay core, release, best of 5 rounds interleaved with
/// the setting off, on a 2-core machine shared with other builds): +80 to +125 ns on 760 to
/// 1,260 ns. About 65 ns of it is two more headers whose name and value are reference counts
/// taken and, when the record is dropped, released; about 35 ns writing the position. A `Vec`
/// per position measured the same, within the noise.
#[derive(Debug)]
pub(crate) struct Stamp {
    source_name: Arc<str>,
    position_name: Arc<str>,
    source: Option<Bytes>,
    arena: BytesMut,
}

impl Stamp {
    pub(crate) fn new() -> Self {
        Stamp {
            source_name: Arc::from(SOURCE_HEADER),
            position_name: Arc::from(POSITION_HEADER),
            source: None,
            arena: BytesMut::new(),
        }
    }

    /// The source the next records come from ([`source_id`]).
    pub(crate) fn set_source(&mut self, source: &str) {
        self.source = Some(Bytes::copy_from_slice(source.as_bytes()));
    }

    /// Whether a source was set.
    pub(crate) fn has_source(&self) -> bool {
        self.source.is_some()
    }

    /// Appends [`SOURCE_HEADER`] and [`POSITION_HEADER`] with `at` to `headers`.
    pub(crate) fn stamp(&mut self, headers: &mut Vec<Header>, at: SourcePosition) {
        if self.arena.capacity() - self.arena.len() < MAX_POSITION_LEN {
            self.arena = BytesMut::with_capacity(ARENA_BYTES);
        }
        at.write(&mut self.arena);
        let position = self.arena.split().freeze();
        headers.push((self.source_name.clone(), self.source.clone()));
        headers.push((self.position_name.clone(), Some(position)));
    }
}

/// The source's identity, as [`SOURCE_HEADER`] carries it: `<database system identifier>/<timeline>/<slot name>`,
/// e.g. `7312345678901234567/1/ferry`.
pub fn source_id(system_identifier: &str, timeline: u32, slot: &str) -> String {
    format!("{system_identifier}/{timeline}/{slot}")
}

/// One half of an LSN: 1 to 8 upper-case hex digits, no leading zero but `0` itself.
fn hex_half(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 8 || (s.len() > 1 && s[0] == b'0') {
        return None;
    }
    let mut v = 0u32;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u32::from(d);
    }
    Some(v)
}

/// A `u32` in decimal: 1 to 10 digits, no sign, no leading zero but `0` itself.
fn decimal(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || (s.len() > 1 && s[0] == b'0') {
        return None;
    }
    let mut v = 0u64;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(b - b'0');
    }
    u32::try_from(v).ok()
}

/// Writes `v` in upper-case hex without leading zeros at `buf[at..]`; returns the end.
fn put_hex(buf: &mut [u8], at: usize, v: u32) -> usize {
    let digits = (8 - v.leading_zeros() as usize / 4).max(1);
    for i in 0..digits {
        buf[at + i] = HEX[((v >> (4 * (digits - 1 - i))) & 0xF) as usize];
    }
    at + digits
}

/// Writes `v` in decimal at `buf[at..]`; returns the end.
fn put_decimal(buf: &mut [u8], at: usize, mut v: u32) -> usize {
    let mut tmp = [0u8; 10];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let digits = tmp.len() - i;
    buf[at..at + digits].copy_from_slice(&tmp[i..]);
    at + digits
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pos(lsn: u64, index: u32) -> SourcePosition {
        SourcePosition {
            commit_lsn: Lsn(lsn),
            index,
        }
    }

    fn text(p: SourcePosition) -> String {
        let mut out = Vec::new();
        p.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn writes_the_commit_lsn_as_pg_lsn_prints_it_and_the_index_in_decimal() {
        assert_eq!(text(pos(0x16B_3748, 3)), "0/16B3748:3");
        assert_eq!(text(pos(0, 0)), "0/0:0");
        assert_eq!(text(pos(0x1_0000_0000, 10)), "1/0:10");
        assert_eq!(
            text(pos(u64::MAX, u32::MAX)),
            "FFFFFFFF/FFFFFFFF:4294967295"
        );
        assert_eq!(text(pos(u64::MAX, u32::MAX)).len(), MAX_POSITION_LEN);
        // The LSN half is the Lsn type's own display.
        let lsn = Lsn(0x16_B374_D848);
        assert_eq!(text(pos(lsn.0, 7)), format!("{lsn}:7"));
        assert_eq!(pos(lsn.0, 7).to_string(), "16/B374D848:7");
    }

    #[test]
    fn appends_to_what_the_buffer_holds() {
        let mut out = b"x".to_vec();
        pos(1, 2).write(&mut out);
        pos(3, 4).write(&mut out);
        assert_eq!(out, b"x0/1:20/3:4");
        let mut arena = bytes::BytesMut::with_capacity(64);
        pos(0xABC, 0).write(&mut arena);
        assert_eq!(&arena[..], b"0/ABC:0");
    }

    #[test]
    fn parses_exactly_what_is_written() {
        assert_eq!(
            SourcePosition::parse(b"0/16B3748:3"),
            Some(pos(0x16B_3748, 3))
        );
        assert_eq!(SourcePosition::parse(b"0/0:0"), Some(pos(0, 0)));
        assert_eq!(
            SourcePosition::parse(b"FFFFFFFF/FFFFFFFF:4294967295"),
            Some(pos(u64::MAX, u32::MAX))
        );
        for bad in [
            &b""[..],
            b":",
            b"/:",
            b"0/0",
            b"0/0:",
            b"/0:0",
            b"0/:0",
            b":0",
            b"0:0",
            b"0/16b3748:3",  // lower case
            b"0/016B3748:3", // leading zero
            b"00/0:0",
            b"0/0:01",
            b"0/0:+1",
            b"0/0:-1",
            b"0/0: 1",
            b" 0/0:0",
            b"0/0:0 ",
            b"0/0:0\n",
            b"0x0/0:0",
            b"0/0:0:0", // extra field
            b"0/0/0:0",
            b"0/0:0/0",
            b"1/2/3:4",
            b"123456789/0:0", // 9 hex digits
            b"0/123456789:0",
            b"0/0:4294967296",  // u32 overflow
            b"0/0:99999999999", // 11 digits
            b"0/0:18446744073709551616",
            b"G/0:0",
            b"0/0:1e3",
            "0/0:٣".as_bytes(), // a non-ASCII digit
        ] {
            assert_eq!(
                SourcePosition::parse(bad),
                None,
                "{:?} should not parse",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn orders_by_commit_lsn_then_index() {
        assert!(pos(1, 9) < pos(2, 0));
        assert!(pos(2, 0) < pos(2, 1));
        assert!(pos(0x1_0000_0000, 0) > pos(0xFFFF_FFFF, u32::MAX));
        let mut v = vec![pos(2, 1), pos(1, 5), pos(2, 0), pos(1, 0)];
        v.sort();
        assert_eq!(v, [pos(1, 0), pos(1, 5), pos(2, 0), pos(2, 1)]);
    }

    #[test]
    fn the_source_is_system_identifier_timeline_and_slot() {
        assert_eq!(
            source_id("7312345678901234567", 1, "ferry"),
            "7312345678901234567/1/ferry"
        );
        assert_eq!(SOURCE_HEADER, "ferry-source");
        assert_eq!(POSITION_HEADER, "ferry-position");
    }

    #[test]
    fn a_stamp_adds_source_then_position_in_reserved_room() {
        let mut stamp = Stamp::new();
        stamp.set_source(&source_id("7", 1, "ferry"));
        let mut values = Vec::new();
        for i in 0..1_000u32 {
            let mut headers: Vec<Header> = Vec::with_capacity(2);
            stamp.stamp(&mut headers, pos(0x16B_3748, i));
            assert_eq!(headers.capacity(), 2, "nothing grew");
            assert_eq!(&*headers[0].0, SOURCE_HEADER);
            assert_eq!(headers[0].1.as_deref(), Some(&b"7/1/ferry"[..]));
            assert_eq!(&*headers[1].0, POSITION_HEADER);
            values.push(headers.pop().unwrap().1.unwrap());
        }
        // Positions split off shared blocks stay intact as later ones are written.
        for (i, v) in values.iter().enumerate() {
            assert_eq!(&v[..], format!("0/16B3748:{i}").as_bytes());
        }
        stamp.set_source("7/2/ferry");
        let mut headers = Vec::new();
        stamp.stamp(&mut headers, pos(1, 0));
        assert_eq!(headers[0].1.as_deref(), Some(&b"7/2/ferry"[..]));
    }

    proptest! {
        #[test]
        fn write_then_parse_round_trips(lsn in any::<u64>(), index in any::<u32>()) {
            let p = pos(lsn, index);
            let mut out = Vec::new();
            p.write(&mut out);
            prop_assert!(out.len() <= MAX_POSITION_LEN);
            prop_assert_eq!(SourcePosition::parse(&out), Some(p));
            prop_assert_eq!(String::from_utf8(out).unwrap(), format!("{}:{index}", Lsn(lsn)));
        }

        /// One spelling per position: whatever parses is written back byte for byte.
        #[test]
        fn whatever_parses_is_written_back_unchanged(
            s in "[0-9A-Fa-f]{0,9}/[0-9A-Fa-f]{0,9}:[0-9]{0,11}|[0-9A-F/:+ x-]{0,30}"
        ) {
            if let Some(p) = SourcePosition::parse(s.as_bytes()) {
                let mut out = Vec::new();
                p.write(&mut out);
                prop_assert_eq!(out, s.as_bytes());
            }
        }

        #[test]
        fn order_is_that_of_the_pair(a in any::<(u64, u32)>(), b in any::<(u64, u32)>()) {
            prop_assert_eq!(pos(a.0, a.1).cmp(&pos(b.0, b.1)), a.cmp(&b));
        }
    }
}
