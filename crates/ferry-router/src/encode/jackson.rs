//! JSON strings as Kafka Connect's `JsonConverter` writes them, through Jackson: the escaping
//! every Connect-compatible format shares (`format.rs` for the key and value formats, `expand.rs`
//! for the expanded payload).
//!
//! Jackson writes compactly (no spaces) and escapes only `"`, `\` and the control characters
//! below U+0020: `\b \t \n \f \r` by their short forms, the rest as `\u00XX` with upper-case
//! hex digits (`CharTypes`); it leaves `/`, DEL and the rest of the BMP as they are. A character
//! beyond the BMP is written as its two UTF-16 surrogates, each escaped (`\uD83D\uDE00`): Java
//! strings hold surrogates and Jackson's UTF-8 generator does not combine them by default (seen
//! against Debezium 3.6.1 in the parity test). serde_json writes lower-case hex, so the escaping
//! here is Ferry's own.

/// A JSON string as Jackson writes it (see the module documentation).
pub(crate) fn jackson_string(buf: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    buf.reserve(s.len() + 2);
    buf.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0xf0 {
            // A character beyond the BMP: Java holds it as two UTF-16 surrogates, and Jackson's
            // UTF-8 generator escapes each (COMBINE_UNICODE_SURROGATES_IN_UTF8 is off by default).
            let c = s[i..]
                .chars()
                .next()
                .map(u32::from)
                .expect("a lead byte of 0xF0 or more starts a 4-byte character")
                - 0x1_0000;
            buf.extend_from_slice(&bytes[start..i]);
            start = i + 4;
            for unit in [0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff)] {
                buf.extend_from_slice(b"\\u");
                for shift in [12, 8, 4, 0] {
                    buf.push(HEX[((unit >> shift) & 15) as usize]);
                }
            }
            continue;
        }
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            b'\t' => b't',
            b'\n' => b'n',
            0x0c => b'f',
            b'\r' => b'r',
            0..=0x1f => 0,
            _ => continue,
        };
        buf.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short != 0 {
            buf.extend_from_slice(&[b'\\', short]);
        } else {
            buf.extend_from_slice(b"\\u00");
            buf.push(HEX[usize::from(b >> 4)]);
            buf.push(HEX[usize::from(b & 15)]);
        }
    }
    buf.extend_from_slice(&bytes[start..]);
    buf.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte below U+0020, `"` and `\` escaped as Jackson's `CharTypes.sOutputEscapes128`
    /// says (short forms for \b \t \n \f \r, else `\u00XX` upper case); all else verbatim.
    #[test]
    fn jackson_escaping_of_every_ascii_byte() {
        for b in 0u8..0x80 {
            let s = char::from(b).to_string();
            let mut buf = Vec::new();
            jackson_string(&mut buf, &s);
            let got = String::from_utf8(buf).unwrap();
            let want = match b {
                0x08 => "\"\\b\"".to_owned(),
                0x09 => "\"\\t\"".to_owned(),
                0x0a => "\"\\n\"".to_owned(),
                0x0c => "\"\\f\"".to_owned(),
                0x0d => "\"\\r\"".to_owned(),
                b'"' => "\"\\\"\"".to_owned(),
                b'\\' => "\"\\\\\"".to_owned(),
                0..=0x1f => format!("\"\\u{:04X}\"", b),
                _ => format!("\"{s}\""),
            };
            assert_eq!(got, want, "byte {b:#04x}");
        }
        let mut buf = Vec::new();
        jackson_string(&mut buf, "é/€ \u{2028}😀\u{1f}𝄞\u{10ffff}\u{ffff}x");
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "\"é/€ \u{2028}\\uD83D\\uDE00\\u001F\\uD834\\uDD1E\\uDBFF\\uDFFF\u{ffff}x\""
        );
    }
}
