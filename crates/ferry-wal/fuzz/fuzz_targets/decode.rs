//! Fuzz target `decode`: arbitrary bytes into every pure decoder of ferry-wal.
//!
//! Asserts that no decoder panics and that whatever decodes re-encodes to exactly the input
//! (the decoders reject trailing bytes and unknown values, so decoding is exact). The input is
//! tried as one pgoutput message in both stream states, as a replication CopyData payload (and
//! an XLogData's data again as pgoutput), as a standby status update, and as a sequence of
//! length-prefixed messages fed to the stateful `Decoder`. The `frames` target covers the
//! protocol framing around these payloads.

#![no_main]

use bytes::Bytes;
use ferry_wal::pgoutput::{decode, Decoder};
use ferry_wal::wire::{ReplicationMessage, StandbyStatusUpdate};
use libfuzzer_sys::fuzz_target;

fn pgoutput_exact(bytes: &Bytes) {
    for in_stream in [false, true] {
        if let Ok(msg) = decode(bytes.clone(), in_stream) {
            assert_eq!(
                &msg.encode(),
                bytes,
                "pgoutput re-encode (in_stream {in_stream})"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    pgoutput_exact(&bytes);

    if let Ok(msg) = ReplicationMessage::decode(bytes.clone()) {
        assert_eq!(msg.encode(), bytes, "replication message re-encode");
        if let ReplicationMessage::XLogData(x) = msg {
            pgoutput_exact(&x.data);
        }
    }
    if let Ok(update) = StandbyStatusUpdate::decode(bytes.clone()) {
        assert_eq!(update.encode(), bytes, "status update re-encode");
    }

    // A stream: each message is a one-byte length then that many bytes.
    let mut decoder = Decoder::new();
    let mut rest = bytes;
    while let Some(&len) = rest.first() {
        let end = (1 + usize::from(len)).min(rest.len());
        let frame = rest.slice(1..end);
        let in_stream = decoder.in_stream();
        if let Ok(msg) = decoder.decode(frame.clone()) {
            assert_eq!(
                msg.encode(),
                frame,
                "Decoder re-encode (in_stream {in_stream})"
            );
        }
        rest = rest.slice(end..);
    }
});
