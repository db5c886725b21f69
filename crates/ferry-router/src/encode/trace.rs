//! Trace context from the writing service to the consumer: `outbox.tracing_column`.
//!
//! The application stores the W3C Trace Context of the span that wrote the outbox row in a column;
//! the router sends it on as the record's `traceparent` and `tracestate` headers, so the consumer
//! continues the same trace (OpenTelemetry's Kafka instrumentation reads exactly these headers).
//!
//! # What the column may hold
//! - **A bare `traceparent`** (`00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`), as a
//!   Go or Python service writes it. Leading and trailing whitespace is ignored. It is sent as is,
//!   without a copy.
//! - **Debezium's `tracingspancontext`**: a serialized `java.util.Properties` holding `traceparent`
//!   and maybe `tracestate`, as OpenTelemetry's `W3CTraceContextPropagator` injects them and
//!   `Properties.store` writes them: a `#` comment line with the date, then `key=value` lines
//!   (Debezium's `ActivateTracingSpan` / `TracingSpanUtil` read it back with `Properties.load`).
//!   The full `Properties.load` grammar is read: `#` and `!` comments, `=`, `:` or whitespace as the
//!   separator, `\`-escapes (`\t`, `\n`, `\r`, `\f`, `\uXXXX`, `\:`, `\=`, ...), lines continued
//!   by a trailing backslash, `\n`, `\r\n` or `\r` line ends. A later key replaces an earlier one.
//!   A text is read as Properties when it has a line break, an `=` or a `:`, or starts with a
//!   comment; a bare `traceparent` has none of these.
//!
//! A NULL, empty or blank value means "no trace context": no headers, nothing counted.
//!
//! Debezium's Quarkus outbox extension (`DataMapTracingSetter`) stores each key the propagator
//! sets in a fresh `Properties`, so when the span has a non-empty `tracestate` the column ends up
//! holding the `tracestate` alone. Debezium cannot continue such a trace either; here it is
//! [`TraceProblem::NoTraceparent`], counted, so the metric shows it.
//!
//! # Validation (W3C Trace Context Level 1)
//! `traceparent` (§3.2.2): `version-traceid-parentid-flags`, every field lowercase hex; version
//! `ff` is invalid; version `00` is exactly 55 characters; a later version may append fields after
//! a `-` at offset 55 (§3.2.4: parse what is known); a trace id or parent id of all zeros is
//! invalid. `tracestate` (§3.3.1): at most 32 comma-separated `key=value` members (empty members
//! allowed), keys `simple-key` or `tenant@system`, values of printable ASCII without `,` and `=`,
//! no key twice.
//!
//! # A malformed value is never fatal
//! A trace context is telemetry, not data: the record still goes, without the header that is
//! wrong. An invalid `traceparent` drops both headers (§3.3: a `tracestate` is meaningless without
//! it); an invalid `tracestate` drops only itself. Either way the record's
//! [`crate::Record::trace_context`] is [`TraceOutcome::Malformed`] with the [`TraceProblem`], so the
//! relay can count it (a closed set: a metric label) and log the event id, never the value.

use std::borrow::Cow;

use bytes::Bytes;

pub use crate::base::trace_outcome::{TraceOutcome, TraceProblem};
use crate::encode::properties::for_each_property;

/// Header carrying the W3C `traceparent`.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Header carrying the W3C `tracestate`.
pub const TRACESTATE_HEADER: &str = "tracestate";
/// The Properties key Debezium's tracing reads the `traceparent` from.
pub const TRACEPARENT_KEY: &str = "traceparent";
/// The Properties key for `tracestate`.
pub const TRACESTATE_KEY: &str = "tracestate";
/// Most list members a `tracestate` may have (W3C Trace Context §3.3.1.1).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Length of a version `00` `traceparent`.
pub const TRACEPARENT_V00_LEN: usize = 55;

/// The headers read from a trace-context value, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceContext {
    /// The `traceparent` header value, if valid.
    pub traceparent: Option<Bytes>,
    /// The `tracestate` header value, if present, non-empty and valid.
    pub tracestate: Option<Bytes>,
    /// The outcome to report.
    pub outcome: TraceOutcome,
}

/// Reads a trace-context column's value (its text bytes): a bare `traceparent` or a
/// `java.util.Properties` text. Never fails: a malformed value gives no header and
/// [`TraceOutcome::Malformed`].
pub fn read_trace_context(value: &Bytes) -> TraceContext {
    let malformed = |p| TraceContext {
        outcome: TraceOutcome::Malformed(p),
        ..TraceContext::default()
    };
    let start = value
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    let trimmed = &value[start..end];
    if trimmed.is_empty() {
        return TraceContext::default();
    }
    let is_properties = matches!(trimmed[0], b'#' | b'!')
        || trimmed
            .iter()
            .any(|b| matches!(b, b'=' | b':' | b'\n' | b'\r'));
    if !is_properties {
        return match validate_traceparent(trimmed) {
            Ok(()) => TraceContext {
                traceparent: Some(value.slice(start..end)),
                tracestate: None,
                outcome: TraceOutcome::Propagated,
            },
            Err(p) => malformed(p),
        };
    }
    let Ok(text) = std::str::from_utf8(value) else {
        return malformed(TraceProblem::NotText);
    };
    // A later key replaces an earlier one, as in a Properties map.
    let (mut parent, mut state): (Option<Cow<'_, str>>, Option<Cow<'_, str>>) = (None, None);
    let read = for_each_property(text, |k, v| match &*k {
        TRACEPARENT_KEY => parent = Some(v),
        TRACESTATE_KEY => state = Some(v),
        _ => {}
    });
    if read.is_err() {
        return malformed(TraceProblem::NotText);
    }
    let last = |key: &str| match key {
        TRACEPARENT_KEY => parent.as_deref(),
        _ => state.as_deref(),
    };
    // A value that borrows from the column's text is sent without a copy.
    let bytes_of = |v: &str| {
        let (base, len) = (value.as_ptr() as usize, value.len());
        let at = v.as_ptr() as usize;
        if at >= base && at + v.len() <= base + len {
            value.slice_ref(v.as_bytes())
        } else {
            Bytes::copy_from_slice(v.as_bytes())
        }
    };
    let Some(traceparent) = last(TRACEPARENT_KEY) else {
        return malformed(TraceProblem::NoTraceparent);
    };
    let traceparent = traceparent.trim_matches(|c: char| c.is_ascii_whitespace());
    if let Err(p) = validate_traceparent(traceparent.as_bytes()) {
        return malformed(p);
    }
    let mut out = TraceContext {
        traceparent: Some(bytes_of(traceparent)),
        tracestate: None,
        outcome: TraceOutcome::Propagated,
    };
    if let Some(state) = last(TRACESTATE_KEY).filter(|s| !s.trim().is_empty()) {
        match validate_tracestate(state.as_bytes()) {
            Ok(()) => out.tracestate = Some(bytes_of(state)),
            Err(p) => out.outcome = TraceOutcome::Malformed(p),
        }
    }
    out
}

fn is_lower_hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks a `traceparent` value against W3C Trace Context §3.2.2 (and §3.2.4 for versions after
/// `00`).
pub fn validate_traceparent(v: &[u8]) -> Result<(), TraceProblem> {
    if v.len() < TRACEPARENT_V00_LEN {
        return Err(TraceProblem::Length);
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return Err(TraceProblem::Layout);
    }
    let (version, trace_id, parent_id, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    if ![version, trace_id, parent_id, flags]
        .iter()
        .all(|f| is_lower_hex(f))
    {
        return Err(TraceProblem::NotLowercaseHex);
    }
    if version == b"ff" {
        return Err(TraceProblem::VersionFf);
    }
    if v.len() > TRACEPARENT_V00_LEN {
        if version == b"00" {
            return Err(TraceProblem::Length);
        }
        if v[TRACEPARENT_V00_LEN] != b'-' {
            return Err(TraceProblem::Layout);
        }
    }
    if trace_id.iter().all(|&c| c == b'0') {
        return Err(TraceProblem::ZeroTraceId);
    }
    if parent_id.iter().all(|&c| c == b'0') {
        return Err(TraceProblem::ZeroParentId);
    }
    Ok(())
}

/// Checks a `tracestate` value against W3C Trace Context §3.3.1: at most 32 members, each
/// `key=value` or empty, with no key twice.
pub fn validate_tracestate(v: &[u8]) -> Result<(), TraceProblem> {
    let bad = Err(TraceProblem::InvalidTracestate);
    // One more than the limit, so the 33rd member is seen; no allocation.
    let mut keys: [&[u8]; MAX_TRACESTATE_MEMBERS + 1] = [&[]; MAX_TRACESTATE_MEMBERS + 1];
    let mut n = 0;
    for member in v.split(|&b| b == b',') {
        let member = trim_ows(member);
        if member.is_empty() {
            continue;
        }
        let Some(eq) = member.iter().position(|&b| b == b'=') else {
            return bad;
        };
        let (key, value) = (&member[..eq], &member[eq + 1..]);
        if !valid_key(key) || !valid_value(value) || keys[..n].contains(&key) {
            return bad;
        }
        if n == MAX_TRACESTATE_MEMBERS {
            return bad;
        }
        keys[n] = key;
        n += 1;
    }
    Ok(())
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = s.iter().position(|b| !ows(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &s[start..end]
}

fn key_char(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/')
}

/// `simple-key = lcalpha 0*255(keychar)` or `tenant-id "@" system-id` with
/// `tenant-id = (lcalpha / DIGIT) 0*240(keychar)`, `system-id = lcalpha 0*13(keychar)`.
fn valid_key(key: &[u8]) -> bool {
    let part = |p: &[u8], first_digit_ok: bool, max: usize| {
        !p.is_empty()
            && p.len() <= max
            && (p[0].is_ascii_lowercase() || (first_digit_ok && p[0].is_ascii_digit()))
            && p[1..].iter().all(|&b| key_char(b))
    };
    match key.iter().position(|&b| b == b'@') {
        None => part(key, false, 256),
        Some(at) => part(&key[..at], true, 241) && part(&key[at + 1..], false, 14),
    }
}

/// `value = 0*255(chr) nblk-chr`, `chr = %x20 / nblk-chr`,
/// `nblk-chr = %x21-2B / %x2D-3C / %x3E-7E`.
fn valid_value(value: &[u8]) -> bool {
    let nblk = |b: u8| matches!(b, 0x21..=0x2B | 0x2D..=0x3C | 0x3E..=0x7E);
    match value.last() {
        None => false,
        Some(&last) => {
            value.len() <= 256 && nblk(last) && value.iter().all(|&b| b == b' ' || nblk(b))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn read(s: &str) -> TraceContext {
        read_trace_context(&Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn traceparent_rules_from_the_w3c_grammar() {
        assert_eq!(validate_traceparent(TP.as_bytes()), Ok(()));
        // §3.2.4: a later version may carry more fields after a '-'.
        let future = format!("cc{}-what-the-future-will-be-like", &TP[2..]);
        assert_eq!(validate_traceparent(future.as_bytes()), Ok(()));
        let cases: &[(&str, TraceProblem)] = &[
            ("", TraceProblem::Length),
            (&TP[..54], TraceProblem::Length),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                TraceProblem::Length,
            ),
            (
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                TraceProblem::Layout,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceProblem::Layout,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
                TraceProblem::Layout,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                TraceProblem::NotLowercaseHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067aa0ba902b7-01",
                TraceProblem::NotLowercaseHex,
            ),
            (
                "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceProblem::NotLowercaseHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
                TraceProblem::NotLowercaseHex,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceProblem::VersionFf,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceProblem::ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceProblem::ZeroParentId,
            ),
        ];
        for (v, want) in cases {
            assert_eq!(validate_traceparent(v.as_bytes()), Err(*want), "{v:?}");
        }
    }

    #[test]
    fn tracestate_rules_from_the_w3c_grammar() {
        for ok in [
            "",
            "congo=t61rcWkgMzE",
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            " rojo=1 ,\tcongo=2 ",
            "a=1,,b=2",
            "tenant1@vendor=x y",
            "0tenant@sys=v",
        ] {
            assert_eq!(validate_tracestate(ok.as_bytes()), Ok(()), "{ok:?}");
        }
        let thirty_two: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        assert_eq!(validate_tracestate(thirty_two.join(",").as_bytes()), Ok(()));
        let thirty_three: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        for bad in [
            "novalue",
            "Upper=1",
            "1digit=1",
            "k=",
            "k=a,b",
            "k=a=b",
            "k=ctl\u{1}",
            "k=1,k=2",
            "@sys=1",
            "t@Sys=1",
            "k=caf\u{e9}",
            &thirty_three.join(","),
        ] {
            assert_eq!(
                validate_tracestate(bad.as_bytes()),
                Err(TraceProblem::InvalidTracestate),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bare_traceparent_is_sent_without_a_copy() {
        let value = Bytes::from(format!("  {TP}\n"));
        let t = read_trace_context(&value);
        assert_eq!(t.outcome, TraceOutcome::Propagated);
        let tp = t.traceparent.unwrap();
        assert_eq!(&tp[..], TP.as_bytes());
        assert_eq!(
            tp.as_ptr(),
            value[2..].as_ptr(),
            "a slice of the column's bytes"
        );
        assert_eq!(t.tracestate, None);
    }

    /// Byte fixture: what `Properties.store(writer, null)` writes for a Properties holding
    /// `traceparent` and `tracestate` (Debezium's outbox extension and `TracingSpanUtil` use
    /// `store`/`load`): a `#` line with `Date.toString()`, then `key=value` lines, `=` and `:`
    /// escaped in values, the platform's line separator.
    #[test]
    fn debezium_tracingspancontext_fixtures() {
        let unix = format!("#Mon Nov 23 22:21:17 UTC 2026\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\ntraceparent={TP}\n");
        let windows = unix.replace('\n', "\r\n");
        for text in [&unix, &windows] {
            let t = read(text);
            assert_eq!(t.outcome, TraceOutcome::Propagated, "{text:?}");
            assert_eq!(t.traceparent.as_deref(), Some(TP.as_bytes()));
            assert_eq!(
                t.tracestate.as_deref(),
                Some(&b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"[..])
            );
        }
        // Values without escapes are slices of the column's bytes.
        let value = Bytes::from(unix.clone());
        let t = read_trace_context(&value);
        let tp = t.traceparent.unwrap();
        let at = unix.find(TP).unwrap();
        assert_eq!(tp.as_ptr(), value[at..].as_ptr());
        // Only a traceparent (the propagator writes no tracestate when it is empty).
        let t = read(&format!(
            "#Tue Jan 05 10:00:00 CET 2027\ntraceparent={TP}\n"
        ));
        assert_eq!(t.outcome, TraceOutcome::Propagated);
        assert_eq!(t.tracestate, None);
        // The other separators, comments, escapes and continuation lines Properties.load reads.
        let t = read(&format!(
            "! a comment\n  # another\n\ntrace\\\n    parent : {}\\\n  {}\ntracestate   k\\u003dv\n",
            &TP[..20],
            &TP[20..]
        ));
        assert_eq!(t.traceparent.as_deref(), Some(TP.as_bytes()), "{t:?}");
        assert_eq!(t.tracestate.as_deref(), Some(&b"k=v"[..]));
        // A later key replaces an earlier one.
        let other = "00-11111111111111111111111111111111-2222222222222222-00";
        let t = read(&format!("traceparent={other}\ntraceparent={TP}"));
        assert_eq!(t.traceparent.as_deref(), Some(TP.as_bytes()));
    }

    #[test]
    fn malformed_values_give_no_headers_and_say_why() {
        let cases: &[(&str, TraceProblem)] = &[
            (
                "#date\nuber-trace-id=abc:def:0:1\n",
                TraceProblem::NoTraceparent,
            ),
            ("traceparent=00-abc", TraceProblem::Length),
            ("traceparent=\\u00zz", TraceProblem::NotText),
            ("not-a-traceparent", TraceProblem::Length),
            (&TP.to_uppercase(), TraceProblem::NotLowercaseHex),
        ];
        for (v, want) in cases {
            let t = read(v);
            assert_eq!(t.outcome, TraceOutcome::Malformed(*want), "{v:?}");
            assert_eq!((t.traceparent, t.tracestate), (None, None), "{v:?}");
        }
        // A bad tracestate keeps the traceparent (W3C §3.3: discard only the tracestate).
        let t = read(&format!("traceparent={TP}\ntracestate=Bad Key=1"));
        assert_eq!(
            t.outcome,
            TraceOutcome::Malformed(TraceProblem::InvalidTracestate)
        );
        assert_eq!(t.traceparent.as_deref(), Some(TP.as_bytes()));
        assert_eq!(t.tracestate, None);
        // Not UTF-8.
        let t = read_trace_context(&Bytes::from_static(b"traceparent=\xff"));
        assert_eq!(t.outcome, TraceOutcome::Malformed(TraceProblem::NotText));
        // Blank means none.
        for blank in ["", "  \n", "\t"] {
            assert_eq!(read(blank), TraceContext::default());
        }
        // Every problem's message says what the column must hold.
        assert!(TraceProblem::Layout
            .to_string()
            .contains("outbox.tracing_column"));
    }
}
