//! Column values as the router needs them: a value's bytes (text as stored, bytea decoded), a
//! timestamp or a partition number.
//!
//! Text format is pgoutput's output-function text (`\x..` for bytea, `t`/`f` for bool, ISO
//! timestamps under the default `DateStyle`). Binary format is each type's send function; only the
//! types an outbox plausibly uses are decoded, anything else is a routing error telling the operator
//! to use text format. Nothing here panics on hostile bytes.

use bytes::Bytes;
use ferry_pgtypes::PgTimestamp;

use crate::base::row::{oid, Value};
use crate::base::timestamp::{format_timestamp, parse_timestamp_micros};

/// Whether the router renders a value of this type from its binary (send function) format, as
/// [`natural_bytes`] and the timestamp and partition readers do; any other type must arrive as
/// text (pgoutput without `binary`).
pub fn renders_binary(type_oid: u32) -> bool {
    matches!(
        type_oid,
        oid::TEXT
            | oid::VARCHAR
            | oid::BPCHAR
            | oid::NAME
            | oid::JSON
            | oid::XML
            | oid::UNKNOWN
            | oid::CHAR
            | oid::BYTEA
            | oid::JSONB
            | oid::UUID
            | oid::INT2
            | oid::INT4
            | oid::INT8
            | oid::OID
            | oid::BOOL
            | oid::TIMESTAMP
            | oid::TIMESTAMPTZ
    )
}

/// The value's bytes: text and json as stored (zero-copy), bytea decoded to raw bytes, binary-format
/// scalars rendered as PostgreSQL's text output would.
// Always inlined: its fast path (text as stored) is a slice, on every column a row keeps, and
// the compiler stopped inlining it once `Value` came from another crate (+160 instructions a row).
#[inline(always)]
pub(crate) fn natural_bytes<'a>(
    type_oid: u32,
    binary: bool,
    v: impl Into<Value<'a>>,
) -> Result<Bytes, String> {
    let v = v.into();
    if !binary && type_oid != oid::BYTEA {
        // Text as stored: most values, read on every row.
        return Ok(v.to_bytes());
    }
    rendered(type_oid, binary, v)
}

/// [`natural_bytes`] of a bytea's text or of a binary-format value. Out of line, so that the
/// text path inlined on every column stays small.
#[inline(never)]
fn rendered(type_oid: u32, binary: bool, v: Value<'_>) -> Result<Bytes, String> {
    if !binary {
        // Only a bytea's text comes here ([`natural_bytes`] returns any other text as stored).
        return decode_bytea_text(&v).map(Bytes::from);
    }
    if !renders_binary(type_oid) {
        return Err(format!(
            "binary format of type OID {type_oid} is not supported; use text format (postgres.binary = false)"
        ));
    }
    match type_oid {
        oid::JSONB => match v.first() {
            Some(1) => Ok(v.tail(1)),
            Some(n) => Err(format!("unsupported binary jsonb version {n}")),
            None => Err("empty binary jsonb value".to_owned()),
        },
        oid::UUID => {
            let b: &[u8; 16] = v
                .as_ref()
                .try_into()
                .map_err(|_| format!("binary uuid must be 16 bytes, got {}", v.len()))?;
            Ok(Bytes::from(format_uuid(b)))
        }
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => {
            Ok(Bytes::from(binary_int(type_oid, &v)?.to_string()))
        }
        oid::BOOL => match v.as_ref() {
            [0] => Ok(Bytes::from_static(b"f")),
            [1] => Ok(Bytes::from_static(b"t")),
            _ => Err("binary bool must be one byte 0 or 1".to_owned()),
        },
        oid::TIMESTAMP | oid::TIMESTAMPTZ => {
            let unix = binary_timestamp_micros(&v)?;
            let mut s = format_timestamp(unix);
            if type_oid == oid::TIMESTAMPTZ {
                s.push_str("+00");
            }
            Ok(Bytes::from(s))
        }
        // Text, json, bytea and the other types whose send format is their bytes.
        _ => Ok(v.to_bytes()),
    }
}

fn binary_int(type_oid: u32, v: &[u8]) -> Result<i64, String> {
    let want = match type_oid {
        oid::INT2 => 2,
        oid::INT4 | oid::OID => 4,
        _ => 8,
    };
    if v.len() != want {
        return Err(format!(
            "binary integer of type OID {type_oid} must be {want} bytes, got {}",
            v.len()
        ));
    }
    Ok(match type_oid {
        oid::INT2 => i64::from(i16::from_be_bytes([v[0], v[1]])),
        oid::INT4 => i64::from(i32::from_be_bytes([v[0], v[1], v[2], v[3]])),
        oid::OID => i64::from(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
        _ => i64::from_be_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]),
    })
}

fn binary_timestamp_micros(v: &[u8]) -> Result<i64, String> {
    let b: [u8; 8] = v
        .try_into()
        .map_err(|_| format!("binary timestamp must be 8 bytes, got {}", v.len()))?;
    match i64::from_be_bytes(b) {
        i64::MAX | i64::MIN => Err("infinite timestamps cannot be a record timestamp".to_owned()),
        pg => PgTimestamp(pg)
            .to_unix_micros()
            .ok_or_else(|| "timestamp out of range".to_owned()),
    }
}

fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[usize::from(byte >> 4)] as char);
        s.push(HEX[usize::from(byte & 15)] as char);
    }
    s
}

/// Decodes bytea text output: hex (`\x0a0b`, the default `bytea_output`) or the legacy escape
/// format (`\\` and `\ooo` octal escapes, other bytes literal).
pub fn decode_bytea_text(v: &[u8]) -> Result<Vec<u8>, String> {
    if let Some(hex) = v.strip_prefix(b"\\x") {
        return decode_hex(hex);
    }
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] != b'\\' {
            out.push(v[i]);
            i += 1;
        } else if v.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let oct = v
                .get(i + 1..i + 4)
                .filter(|o| o[0] <= b'3' && o.iter().all(|d| (b'0'..=b'7').contains(d)))
                .ok_or_else(|| format!("bad escape in bytea escape-format text at byte {i}"))?;
            out.push((oct[0] - b'0') << 6 | (oct[1] - b'0') << 3 | (oct[2] - b'0'));
            i += 4;
        }
    }
    Ok(out)
}

/// Hex digit values; `INVALID` marks every other byte.
const HEX: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};
const INVALID: u8 = 0x10;

/// Decodes hex digits into bytes (a payload column is decoded whole, so this is a hot path: a
/// table lookup per digit, one allocation, and a single check of all digits at the end).
fn decode_hex(hex: &[u8]) -> Result<Vec<u8>, String> {
    if hex.len() % 2 != 0 {
        return Err("bytea hex text has an odd number of digits".to_owned());
    }
    let mut out = Vec::with_capacity(hex.len() / 2);
    let mut bad = 0u8;
    out.extend(hex.chunks_exact(2).map(|p| {
        let (h, l) = (HEX[p[0] as usize], HEX[p[1] as usize]);
        bad |= h | l;
        h << 4 | l
    }));
    if bad & INVALID != 0 {
        return Err("bytea hex text has a non-hex digit".to_owned());
    }
    Ok(out)
}

/// The record timestamp (ms since the Unix epoch) from a timestamp column: timestamptz/timestamp
/// (timestamp without time zone is taken as UTC), text in that format, or an integer of epoch ms.
pub(crate) fn timestamp_ms<'a>(
    type_oid: u32,
    binary: bool,
    v: impl Into<Value<'a>>,
) -> Result<i64, String> {
    let v = v.into();
    let micros = match (type_oid, binary) {
        (oid::TIMESTAMP | oid::TIMESTAMPTZ, true) => binary_timestamp_micros(&v)?,
        (oid::INT2 | oid::INT4 | oid::INT8, _) => return integer(type_oid, binary, v),
        _ => {
            let text = natural_bytes(type_oid, binary, v)?;
            let s = std::str::from_utf8(&text).map_err(|_| "timestamp text is not UTF-8")?;
            parse_timestamp_micros(s)?
        }
    };
    Ok(micros.div_euclid(1000))
}

/// An explicit partition number: an integer between 0 and `i32::MAX`.
pub(crate) fn partition<'a>(
    type_oid: u32,
    binary: bool,
    v: impl Into<Value<'a>>,
) -> Result<i32, String> {
    let n = integer(type_oid, binary, v.into())?;
    i32::try_from(n)
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(|| format!("partition {n} is out of range (0 to {})", i32::MAX))
}

fn integer(type_oid: u32, binary: bool, v: Value<'_>) -> Result<i64, String> {
    if binary && matches!(type_oid, oid::INT2 | oid::INT4 | oid::INT8 | oid::OID) {
        return binary_int(type_oid, &v);
    }
    let text = natural_bytes(type_oid, binary, v)?;
    std::str::from_utf8(&text)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "{:?} is not an integer",
                String::from_utf8_lossy(&text[..text.len().min(64)])
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytea_text_table() {
        let ok: &[(&[u8], &[u8])] = &[
            (b"\\x", b""),
            (b"\\x0a0B", b"\x0a\x0b"),
            (b"\\xdeadbeef", b"\xde\xad\xbe\xef"),
            (b"abc", b"abc"),
            (b"a\\\\b", b"a\\b"),
            (b"\\000\\377x", b"\x00\xffx"),
        ];
        for (text, want) in ok {
            assert_eq!(decode_bytea_text(text).unwrap(), *want, "{text:?}");
        }
        let bad: &[&[u8]] = &[b"\\x0", b"\\xzz", b"\\", b"\\4000", b"\\12", b"\\9aa"];
        for text in bad {
            assert!(decode_bytea_text(text).is_err(), "{text:?}");
        }
    }

    /// `renders_binary` says exactly which types `natural_bytes` renders from binary.
    #[test]
    fn renders_binary_matches_natural_bytes() {
        for type_oid in 0..20_000u32 {
            let refused = natural_bytes(type_oid, true, &Bytes::from_static(b"\x01"))
                .err()
                .is_some_and(|e| e.contains("is not supported"));
            assert_eq!(renders_binary(type_oid), !refused, "type OID {type_oid}");
        }
    }

    /// Every pair of bytes, against `u8::from_str_radix`: the table accepts exactly the hex
    /// digits of both cases and nothing else.
    #[test]
    fn hex_pairs_exhaustive() {
        for hi in 0..=255u8 {
            for lo in 0..=255u8 {
                let text = [b'\\', b'x', hi, lo, b'0', b'f'];
                let reference = std::str::from_utf8(&[hi, lo])
                    .ok()
                    .filter(|s| s.bytes().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|s| u8::from_str_radix(s, 16).ok());
                match (decode_bytea_text(&text), reference) {
                    (Ok(got), Some(want)) => assert_eq!(got, [want, 0x0f]),
                    (Err(_), None) => {}
                    (got, want) => panic!("{hi:#04x} {lo:#04x}: {got:?} vs {want:?}"),
                }
            }
        }
    }

    #[test]
    fn binary_values_table() {
        let b = |v: &[u8]| Bytes::copy_from_slice(v);
        type Case<'a> = (u32, &'a [u8], Result<&'a [u8], &'a str>);
        let cases: &[Case<'_>] = &[
            (oid::TEXT, b"hi", Ok(b"hi")),
            (oid::BYTEA, b"\x00\x01", Ok(b"\x00\x01")),
            (oid::JSONB, b"\x01{\"a\":1}", Ok(b"{\"a\":1}")),
            (oid::JSONB, b"\x02{}", Err("version 2")),
            (oid::JSONB, b"", Err("empty")),
            (
                oid::UUID,
                &[
                    0x4d, 0x47, 0xe1, 0x90, 0x04, 0x02, 0x40, 0x48, 0xbc, 0x2c, 0x89, 0xdd, 0x54,
                    0x34, 0x3c, 0xdc,
                ],
                Ok(b"4d47e190-0402-4048-bc2c-89dd54343cdc"),
            ),
            (oid::UUID, b"short", Err("16 bytes")),
            (oid::INT2, &[0xff, 0xfe], Ok(b"-2")),
            (oid::INT4, &[0, 0, 1, 0], Ok(b"256")),
            (oid::INT8, &[0, 0, 0, 0, 0, 0, 0, 42], Ok(b"42")),
            (oid::INT8, &[0, 42], Err("8 bytes")),
            (oid::BOOL, &[1], Ok(b"t")),
            (oid::BOOL, &[2], Err("0 or 1")),
            (
                oid::TIMESTAMPTZ,
                &[0; 8],
                Ok(b"2000-01-01 00:00:00.000000+00"),
            ),
            (
                oid::TIMESTAMP,
                &[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Err("infinite"),
            ),
            (oid::NUMERIC, &[0, 1], Err("not supported")),
        ];
        for (ty, v, want) in cases {
            let got = natural_bytes(*ty, true, &b(v));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(&g[..], *w, "oid {ty}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "oid {ty}: {g}"),
                (g, w) => panic!("oid {ty}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn timestamp_and_partition_columns() {
        let b = |v: &str| Bytes::copy_from_slice(v.as_bytes());
        assert_eq!(
            timestamp_ms(oid::TIMESTAMPTZ, false, &b("1970-01-01 00:00:01.9999+00")),
            Ok(1999)
        );
        assert_eq!(
            timestamp_ms(oid::INT8, false, &b("1700000000000")),
            Ok(1_700_000_000_000)
        );
        assert_eq!(
            timestamp_ms(oid::TEXT, false, &b("1970-01-01T00:00:00Z")),
            Ok(0)
        );
        assert_eq!(
            timestamp_ms(
                oid::TIMESTAMPTZ,
                true,
                &Bytes::copy_from_slice(&1_000i64.to_be_bytes())
            ),
            Ok(PgTimestamp::POSTGRES_EPOCH_UNIX_MICROS / 1000 + 1)
        );
        assert!(timestamp_ms(oid::TIMESTAMPTZ, false, &b("yesterday")).is_err());
        assert_eq!(partition(oid::INT4, false, &b("7")), Ok(7));
        assert_eq!(
            partition(oid::INT2, true, &Bytes::from_static(&[0, 3])),
            Ok(3)
        );
        assert_eq!(partition(oid::TEXT, false, &b("0")), Ok(0));
        for bad in ["-1", "2147483648", "x", ""] {
            assert!(partition(oid::INT8, false, &b(bad)).is_err(), "{bad}");
        }
    }
}
