//! The in-flight window: how many records and bytes may be handed to the sink and not yet
//! reported. Reading WAL stops when either bound is reached, and resumes only once both have
//! drained to half: without the hysteresis every acknowledgement would let exactly one record
//! in, and the driver would ping-pong with the producer one record at a time.

/// After the window filled up, reading resumes once it has drained to this fraction.
const RESUME_FRACTION: u64 = 2; // resume at half

/// See the [module documentation](self).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    max_records: u64,
    max_bytes: u64,
    /// The window filled up and has not yet drained enough to read again.
    paused: bool,
}

impl Window {
    pub fn new(max_records: u64, max_bytes: u64) -> Self {
        Window {
            max_records: max_records.max(1),
            max_bytes: max_bytes.max(1),
            paused: false,
        }
    }

    /// Whether more WAL may be taken with `records` and `bytes` in flight.
    pub fn open(&mut self, records: u64, bytes: u64) -> bool {
        if self.paused {
            self.paused = records > self.max_records / RESUME_FRACTION
                || bytes > self.max_bytes / RESUME_FRACTION;
        } else {
            self.paused = records >= self.max_records || bytes >= self.max_bytes;
        }
        !self.paused
    }

    /// Forgets a pause (a new session starts reading).
    pub fn unpause(&mut self) {
        self.paused = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_at_either_bound_and_reopens_at_half_of_both() {
        let mut w = Window::new(10, 1000);
        assert!(w.open(9, 999));
        assert!(!w.open(10, 0), "record bound");
        assert!(!w.open(6, 0), "still above half");
        assert!(w.open(5, 0), "half of the records");
        assert!(!w.open(0, 1000), "byte bound");
        assert!(!w.open(0, 501));
        assert!(!w.open(6, 500), "both must be at half");
        assert!(w.open(5, 500));
        assert!(!w.open(10, 0));
        w.unpause();
        assert!(w.open(9, 0));
    }
}
