//! What a record must be to be stored, checked before the database sees it.

use super::PayloadType;

/// Why `payload` cannot go into a column of type `ty`, if it cannot.
pub(super) fn payload_problem(payload: &[u8], ty: PayloadType) -> Option<String> {
    match ty {
        PayloadType::Bytea => None,
        PayloadType::Text => text_problem(payload, "the payload"),
        PayloadType::Jsonb => {
            if let Some(p) = text_problem(payload, "the payload") {
                return Some(p);
            }
            match serde_json::from_slice::<serde::de::IgnoredAny>(payload) {
                Ok(_) => None,
                Err(e) => Some(format!(
                    "the payload is not JSON ({e}) and the inbox's payload column is jsonb \
                     (inbox.payload_type = \"jsonb\"); store such payloads with \
                     inbox.payload_type = \"bytea\" or \"text\" and a column of that type"
                )),
            }
        }
    }
}

fn text_problem(bytes: &[u8], what: &str) -> Option<String> {
    match std::str::from_utf8(bytes) {
        Err(e) => Some(format!(
            "{what} is not UTF-8 text (invalid byte at {}); store such payloads with \
             inbox.payload_type = \"bytea\" and a bytea column",
            e.valid_up_to()
        )),
        Ok(s) if s.contains('\0') => Some(format!(
            "{what} contains a NUL character, which PostgreSQL text cannot hold; store such \
             payloads with inbox.payload_type = \"bytea\""
        )),
        Ok(_) => None,
    }
}

/// The event id in a header value, or why it cannot be one.
pub(super) fn event_id(value: &[u8], header: &str) -> Result<String, String> {
    match std::str::from_utf8(value) {
        Ok(s) if s.contains('\0') => Err(format!(
            "the event id header `{header}` contains a NUL character"
        )),
        Ok("") => Err(format!("the event id header `{header}` is empty")),
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(format!(
            "the event id header `{header}` is not UTF-8 text; set inbox.event_id_header to \
             the header that carries the event id, or to \"\" to store without deduplication"
        )),
    }
}
