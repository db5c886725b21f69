//! The encode layer: the bytes a record carries. Kafka Connect's `JsonConverter` formats, with
//! Jackson's string escaping and Debezium's payload expansion; the CloudEvents output; the W3C
//! trace-context headers and the `java.util.Properties` text Debezium stores them in; and the JSON
//! of envelopes. Imports only [`crate::base`]'s modules.

pub mod cloudevents;
pub(crate) mod expand;
pub mod format;
pub(crate) mod jackson;
pub(crate) mod json;
pub mod properties;
pub mod trace;
