//! A pure, bounded parser for HTTP/1.x request heads: the sans-io half of the telemetry server.
//!
//! The telemetry server answers three `GET` routes, so it needs very little of a request: the
//! method, the path, whether the connection may be kept alive and whether a body follows (it never
//! reads bodies; a request that announces one is answered and the connection closed, since the body's
//! bytes would otherwise be taken for the next request). [`parse`] takes the bytes received so far
//! and says "incomplete", "complete (consumed n bytes)" or why the head is unacceptable. It never
//! panics and never looks past `max_len` bytes, so a client cannot make the server buffer more than
//! that (RFC 9112 §2.3 leaves the limit to the server; 431 is the answer when it is exceeded).
//!
//! Accepted: origin-form targets (`/path?query`), `HTTP/1.0` and `HTTP/1.1`, lines ending in CRLF or a
//! bare LF, empty lines before the request line (RFC 9112 §2.2). Rejected: obsolete line folding,
//! header names with whitespace before the colon, malformed `Content-Length`.

/// The request method, as far as the routes care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Head,
    /// Any other syntactically valid method (answered 405 on a known route).
    Other,
}

/// What the server needs of a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestHead {
    pub method: Method,
    /// The target's path, without the query string.
    pub path: String,
    /// Whether the client allows the connection to stay open after the response.
    pub keep_alive: bool,
    /// Whether a body follows the head (`Content-Length` > 0 or any `Transfer-Encoding`).
    pub has_body: bool,
}

/// Why a request head was refused; each maps to one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 431: the head is longer than the limit.
    TooLarge,
    /// 505: an HTTP version other than 1.0 and 1.1.
    Version,
    /// 400: anything else that is not a well-formed request head.
    Malformed(&'static str),
}

/// Parses the head at the start of `buf`. `Ok(None)` means more bytes are needed; `Ok(Some((head,
/// n)))` means the head took the first `n` bytes (what follows may be a pipelined request).
pub(crate) fn parse(buf: &[u8], max_len: usize) -> Result<Option<(RequestHead, usize)>, HeadError> {
    // Leading empty lines count towards the limit too, or a stream of CRLFs would grow the buffer.
    let window = &buf[..buf.len().min(max_len)];
    let start = window
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(window.len());
    let Some(end) = head_end(window, start) else {
        return if buf.len() >= max_len {
            Err(HeadError::TooLarge)
        } else {
            Ok(None)
        };
    };
    let head = parse_head(&buf[start..end])?;
    Ok(Some((head, end)))
}

/// The index just past the blank line that ends the head starting at `start`, if it is in `buf`.
fn head_end(buf: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    while let Some(off) = buf.get(i..)?.iter().position(|&b| b == b'\n') {
        let nl = i + off;
        match buf.get(nl + 1..) {
            Some([b'\n', ..]) => return Some(nl + 2),
            Some([b'\r', b'\n', ..]) => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

fn parse_head(head: &[u8]) -> Result<RequestHead, HeadError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::Malformed(
            "request line is not `METHOD TARGET VERSION`",
        ));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(HeadError::Malformed("invalid method"));
    }
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        _ => Method::Other,
    };
    if target.first() != Some(&b'/') || !target.iter().all(|&b| b.is_ascii_graphic()) {
        return Err(HeadError::Malformed("target must be an origin-form path"));
    }
    let path_bytes = target.split(|&b| b == b'?').next().unwrap_or_default();
    // Graphic ASCII only, checked above, so this is valid UTF-8.
    let path = String::from_utf8_lossy(path_bytes).into_owned();
    let mut keep_alive = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        v if v.starts_with(b"HTTP/") => return Err(HeadError::Version),
        _ => return Err(HeadError::Malformed("invalid HTTP version")),
    };
    let mut has_body = false;
    for line in lines.filter(|l| !l.is_empty()) {
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(HeadError::Malformed("obsolete header line folding"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeadError::Malformed("header without a colon"))?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(HeadError::Malformed("invalid header name"));
        }
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let len = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(HeadError::Malformed("invalid Content-Length"))?;
            has_body |= len > 0;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            has_body = true;
        }
    }
    Ok(RequestHead {
        method,
        path,
        keep_alive,
        has_body,
    })
}

/// RFC 9110 §5.6.2 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (RequestHead, usize) {
        parse(raw.as_bytes(), 8192).unwrap().unwrap()
    }

    #[test]
    fn parses_a_minimal_get() {
        let raw = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next";
        let (head, n) = ok(raw);
        assert_eq!(
            head,
            RequestHead {
                method: Method::Get,
                path: "/metrics".into(),
                keep_alive: true,
                has_body: false
            }
        );
        assert_eq!(&raw[n..], "GET /next", "pipelined bytes are left alone");
    }

    #[test]
    fn connection_semantics_follow_the_version_and_header() {
        assert!(!ok("GET / HTTP/1.0\r\n\r\n").0.keep_alive);
        assert!(
            ok("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(
            !ok("GET / HTTP/1.1\r\nconnection: foo, close\r\n\r\n")
                .0
                .keep_alive
        );
        assert!(
            ok("HEAD / HTTP/1.1\nHost: x\n\n").0.keep_alive,
            "bare LF line endings"
        );
    }

    #[test]
    fn bodies_are_noticed() {
        assert!(!ok("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0.has_body);
        assert!(
            ok("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
                .0
                .has_body
        );
        assert!(
            ok("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .0
                .has_body
        );
        assert_eq!(ok("DELETE / HTTP/1.1\r\n\r\n").0.method, Method::Other);
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let (head, n) = ok("\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(head.path, "/healthz");
        assert_eq!(n, 29);
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        let raw = b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..raw.len() {
            assert_eq!(parse(&raw[..cut], 8192), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn the_size_limit_holds_with_and_without_a_terminator() {
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(100));
        assert_eq!(parse(long.as_bytes(), 64), Err(HeadError::TooLarge));
        assert_eq!(parse(&long.as_bytes()[..70], 64), Err(HeadError::TooLarge));
        assert_eq!(parse(&long.as_bytes()[..50], 64), Ok(None));
        assert!(
            parse(long.as_bytes(), long.len()).unwrap().is_some(),
            "exactly the limit is fine"
        );
        assert_eq!(
            parse("\r\n".repeat(40).as_bytes(), 64),
            Err(HeadError::TooLarge),
            "empty lines count"
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        for raw in [
            "GET /\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\n\r\n",
            "G(T / HTTP/1.1\r\n\r\n",
            "GET / FTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nNo colon\r\n\r\n",
            "GET / HTTP/1.1\r\nBad name: x\r\n\r\n",
            "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        ] {
            assert!(
                matches!(parse(raw.as_bytes(), 8192), Err(HeadError::Malformed(_))),
                "{raw:?}"
            );
        }
        assert_eq!(
            parse(b"GET / HTTP/2.0\r\n\r\n", 8192),
            Err(HeadError::Version)
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..300), max in 1usize..400)| {
            if let Ok(Some((_, n))) = parse(&bytes, max) {
                prop_assert!(n <= bytes.len());
            }
        });
    }
}
