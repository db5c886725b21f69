//! Fuzz target `frames`: arbitrary bytes as what a replication connection reads from its socket.
//!
//! The bytes go through the same steps as `conn::replication`: [`frame::split`] cuts whole
//! messages off the buffer (fed in the chunk sizes the first byte picks, as reads arrive),
//! [`StreamFrame::decode`] says what each is, a CopyData payload is decoded as a replication
//! message and an XLogData's data as pgoutput through the stateful `Decoder`. Asserts that
//! nothing panics, that chunking does not change what is split, and that every decoded frame
//! and payload re-encodes to exactly its bytes.

#![no_main]

use bytes::BytesMut;
use ferry_wal::frame::{self, StreamFrame};
use ferry_wal::pgoutput::Decoder;
use ferry_wal::wire::ReplicationMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, wire)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);

    // All at once, then in chunks: the same messages either way.
    let mut whole = BytesMut::from(wire);
    let mut at_once = Vec::new();
    while let Ok(Some(raw)) = frame::split(&mut whole) {
        at_once.push(raw);
    }
    let mut read = BytesMut::new();
    let mut chunked = Vec::new();
    let mut failed = false;
    for piece in wire.chunks(chunk) {
        read.extend_from_slice(piece);
        loop {
            match frame::split(&mut read) {
                Ok(Some(raw)) => chunked.push(raw),
                Ok(None) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            break;
        }
    }
    assert_eq!(at_once, chunked, "chunking changed the split");

    let mut decoder = Decoder::new();
    for raw in at_once {
        let bytes = raw.clone().into_message().freeze();
        let Ok(frame) = StreamFrame::decode(raw) else {
            continue;
        };
        assert_eq!(frame.encode(), bytes, "frame re-encode");
        let StreamFrame::CopyData(payload) = frame else {
            continue;
        };
        let Ok(msg) = ReplicationMessage::decode(payload.clone()) else {
            continue;
        };
        assert_eq!(msg.encode(), payload, "replication message re-encode");
        if let ReplicationMessage::XLogData(x) = msg {
            let in_stream = decoder.in_stream();
            if let Ok(m) = decoder.decode(x.data.clone()) {
                assert_eq!(m.encode(), x.data, "pgoutput re-encode (in_stream {in_stream})");
            }
        }
    }
});
