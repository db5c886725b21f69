//! What librdkafka borrows from Ferry until a record's delivery report: the record's value.
//!
//! [`super::Producer::send`] hands librdkafka the value's bytes *without* its copy
//! (`rd_kafka_produceva` without `RD_KAFKA_MSG_F_COPY`): librdkafka keeps a pointer into them
//! until the record is reported, reading them when it writes the record into a produce request
//! (and again for a retry). So the value's [`Bytes`] handle (a reference count on the buffer it
//! came in, a WAL read chunk or the router's rendering) is kept here, in a slot whose index
//! travels as librdkafka's per-message opaque, and released when the report for that slot is
//! handled. The caller's own key (the relay core's token) is kept beside it and handed back
//! with the report.
//!
//! **Why this is safe.** librdkafka reads a message's payload only while it holds the message;
//! it lets go of a message only by reporting it (delivered, failed, purged, or timed out:
//! `delivery.report.only.error` is never set) or by `rd_kafka_destroy`. The slots live in the
//! client's context, which rust-rdkafka drops *after* `rd_kafka_destroy` has returned (its
//! `Client` drops the native handle before the context), so no value is released while
//! librdkafka could still read it, whatever path ends the client. A report releases its slot
//! exactly once: a slot that is not taken (which would be a bug) is logged and ignored.
//!
//! No allocation per record once the slots have grown to the in-flight window, and one
//! uncontended lock per send and per batch of reports: sends and reports both happen on the
//! pipeline's thread (see [`super::client`]).

use bytes::Bytes;

/// The slots (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Kept {
    slots: Vec<Option<(usize, Option<Bytes>)>>,
    free: Vec<usize>,
    held: usize,
}

impl Kept {
    /// Keeps `value` alive for the record the caller knows as `key`; the slot to pass as the
    /// message's opaque.
    pub fn keep(&mut self, key: usize, value: Option<Bytes>) -> usize {
        self.held += 1;
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some((key, value));
                slot
            }
            None => {
                self.slots.push(Some((key, value)));
                self.slots.len() - 1
            }
        }
    }

    /// Releases `slot` (its report was handled, or librdkafka refused the record): the caller's
    /// key, or `None` for a slot not held.
    pub fn release(&mut self, slot: usize) -> Option<usize> {
        let (key, _value) = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        self.held -= 1;
        Some(key)
    }

    /// Records whose values are kept.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_released_once_and_reused() {
        let mut k = Kept::default();
        let value = Bytes::from_static(b"payload");
        let a = k.keep(7, Some(value.clone()));
        let b = k.keep(9, None);
        assert_ne!(a, b);
        assert_eq!(k.held(), 2);
        assert_eq!(k.release(a), Some(7));
        assert_eq!(k.release(a), None, "a second report of a slot is ignored");
        assert_eq!(k.release(99), None);
        let c = k.keep(11, Some(value));
        assert_eq!(c, a, "freed slots are reused: no growth past the window");
        assert_eq!(k.release(b), Some(9));
        assert_eq!(k.release(c), Some(11));
        assert_eq!(k.held(), 0);
    }

    #[test]
    fn the_value_lives_until_its_slot_is_released() {
        let mut k = Kept::default();
        let value = Bytes::from(vec![1u8; 4096]);
        let weak_probe = value.clone();
        let slot = k.keep(1, Some(value));
        // Two handles: the probe and the kept one (Bytes from a Vec is unique until cloned).
        assert!(!weak_probe.is_unique());
        k.release(slot);
        assert!(weak_probe.is_unique(), "released with its slot");
    }
}
