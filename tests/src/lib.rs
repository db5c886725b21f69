//! Ferry's end-to-end tests live in `tests/`: real PostgreSQL, a real Kafka-protocol broker and
//! the real `ferry` binary (`src/bin/ferry-under-test.rs` is the same entry point as `ferry`,
//! built here so the tests can spawn and `kill -9` it). Helpers: `tests/common/mod.rs`.
