//! A column value as JSON where Ferry, not Kafka Connect, chooses the representation: a field of
//! the envelope (`route.envelope` with `as_stored`) and the `data` of a structured CloudEvent;
//! and base64, which Kafka Connect's formats use for `bytes` too (Jackson's default variant:
//! standard alphabet, padded, no line feeds).

use crate::base::row::oid;

/// Appends the JSON rendering of a value (its natural bytes `v`) for envelope mode: json/jsonb as
/// is, integers and finite numbers as numbers, bool as `true`/`false`, bytea as a base64 string,
/// everything else as a JSON string.
pub(crate) fn write_json(buf: &mut Vec<u8>, type_oid: u32, v: &[u8]) -> Result<(), String> {
    match type_oid {
        oid::JSON | oid::JSONB => buf.extend_from_slice(v),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID | oid::NUMERIC | oid::FLOAT4 | oid::FLOAT8
            if serde_json::from_slice::<serde_json::Number>(v).is_ok() =>
        {
            buf.extend_from_slice(v)
        }
        oid::BOOL if matches!(v, b"t" | b"true") => buf.extend_from_slice(b"true"),
        oid::BOOL if matches!(v, b"f" | b"false") => buf.extend_from_slice(b"false"),
        oid::BYTEA => {
            buf.push(b'"');
            base64(buf, v);
            buf.push(b'"');
        }
        _ => {
            let s = std::str::from_utf8(v).map_err(|_| "text is not valid UTF-8".to_owned())?;
            // Serializing a &str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *buf, s);
        }
    }
    Ok(())
}

/// Appends `v` as base64: standard alphabet, padded, no line feeds.
pub(crate) fn base64(buf: &mut Vec<u8>, v: &[u8]) {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for c in v.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(*c.get(1).unwrap_or(&0)) << 8
            | u32::from(*c.get(2).unwrap_or(&0));
        buf.push(A[(n >> 18) as usize & 63]);
        buf.push(A[(n >> 12) as usize & 63]);
        buf.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        buf.push(if c.len() > 2 {
            A[n as usize & 63]
        } else {
            b'='
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_rendering_table() {
        let cases: &[(u32, &[u8], &str)] = &[
            (oid::JSONB, b"{\"a\": 1}", "{\"a\": 1}"),
            (oid::INT4, b"-12", "-12"),
            (oid::NUMERIC, b"1.50", "1.50"),
            (oid::NUMERIC, b"NaN", "\"NaN\""),
            (oid::FLOAT8, b"Infinity", "\"Infinity\""),
            (oid::BOOL, b"t", "true"),
            (oid::BOOL, b"false", "false"),
            (oid::BYTEA, b"", "\"\""),
            (oid::BYTEA, b"f", "\"Zg==\""),
            (oid::BYTEA, b"fo", "\"Zm8=\""),
            (oid::BYTEA, b"foobar", "\"Zm9vYmFy\""),
            (oid::TEXT, b"say \"hi\"\n", "\"say \\\"hi\\\"\\n\""),
            (
                oid::UUID,
                b"4d47e190-0402-4048-bc2c-89dd54343cdc",
                "\"4d47e190-0402-4048-bc2c-89dd54343cdc\"",
            ),
        ];
        for (ty, v, want) in cases {
            let mut buf = Vec::new();
            write_json(&mut buf, *ty, v).unwrap();
            assert_eq!(String::from_utf8(buf).unwrap(), *want, "oid {ty} {v:?}");
        }
        assert!(write_json(&mut Vec::new(), oid::TEXT, b"\xff").is_err());
    }
}
