//! What became of a record's trace context ([`TraceOutcome`], carried by every
//! [`crate::Record`]) and why a value was not sent ([`TraceProblem`], a closed set usable as a
//! metric label). Reading the value is [`crate::trace`]'s; these types sit below it because the
//! record and the Properties reader name them too.

use std::fmt;

/// What became of a record's trace context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TraceOutcome {
    /// No trace-context column, or its value is NULL or blank.
    #[default]
    None,
    /// Sent as `traceparent` (and `tracestate` when there was one).
    Propagated,
    /// The value was malformed; the bad header(s) were left out and the record still goes.
    Malformed(TraceProblem),
}

/// Why a trace-context value was not sent: a closed set, usable as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceProblem {
    /// The value is not UTF-8 text, or a Properties text has a malformed `\uXXXX` escape.
    NotText,
    /// A Properties text without a `traceparent` key (e.g. only an OpenTracing `uber-trace-id`).
    NoTraceparent,
    /// Shorter than 55 characters, or a version `00` value that is not exactly 55.
    Length,
    /// The `-` separators are not at offsets 2, 35 and 52 (and 55 when longer).
    Layout,
    /// A field holds something other than lowercase hex digits.
    NotLowercaseHex,
    /// Version `ff`, which W3C Trace Context forbids.
    VersionFf,
    /// The trace id is all zeros.
    ZeroTraceId,
    /// The parent id is all zeros.
    ZeroParentId,
    /// The `tracestate` breaks §3.3.1 (the `traceparent` was still sent).
    InvalidTracestate,
}

impl TraceProblem {
    /// A short, stable name (metric label).
    pub fn code(self) -> &'static str {
        match self {
            TraceProblem::NotText => "not_text",
            TraceProblem::NoTraceparent => "no_traceparent",
            TraceProblem::Length => "length",
            TraceProblem::Layout => "layout",
            TraceProblem::NotLowercaseHex => "not_lowercase_hex",
            TraceProblem::VersionFf => "version_ff",
            TraceProblem::ZeroTraceId => "zero_trace_id",
            TraceProblem::ZeroParentId => "zero_parent_id",
            TraceProblem::InvalidTracestate => "invalid_tracestate",
        }
    }
}

impl fmt::Display for TraceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceProblem::NotText => {
                "the trace context is not UTF-8 text (or has a malformed \\uXXXX escape)"
            }
            TraceProblem::NoTraceparent => "the Properties text has no traceparent key",
            TraceProblem::Length => {
                "the traceparent has the wrong length (version 00: exactly 55 characters)"
            }
            TraceProblem::Layout => {
                "the traceparent is not version-traceid-parentid-flags separated by '-'"
            }
            TraceProblem::NotLowercaseHex => "a traceparent field is not lowercase hex",
            TraceProblem::VersionFf => "traceparent version ff is invalid",
            TraceProblem::ZeroTraceId => "the traceparent's trace id is all zeros",
            TraceProblem::ZeroParentId => "the traceparent's parent id is all zeros",
            TraceProblem::InvalidTracestate => {
                "the tracestate is not a valid W3C list (sent the traceparent alone)"
            }
        })?;
        f.write_str("; the application must write a W3C traceparent (or Debezium's tracingspancontext) into outbox.tracing_column")
    }
}
