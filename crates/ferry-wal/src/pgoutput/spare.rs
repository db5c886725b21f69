//! Spare tuple vectors, kept per thread: a tuple's columns go back here when the tuple is
//! dropped ([`super::Tuple`]), and the next tuple decoded takes one.
//!
//! The reader decodes a burst of up to ~250 rows before the pipeline takes any, and each row's
//! `Vec` of values was a fresh allocation: past glibc's per-thread cache (seven chunks of a
//! size), so through its bins, and freed the same way, ~270 instructions a row in all. A spare
//! vector costs a thread-local lookup and a push or a pop.

use std::cell::RefCell;

use super::Col;

/// Spare vectors kept per thread: two bursts' rows.
const MAX_SPARE: usize = 512;
/// A vector with room for more values than this (a wide table's) is not kept.
const MAX_KEPT_CAPACITY: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<Vec<Col>>> = const { RefCell::new(Vec::new()) };
}

/// An empty vector with room for `capacity` values: a spare one if there is one of about that
/// size (with outbox tables of different widths, a narrow row does not keep a wide row's room).
pub(crate) fn take(capacity: usize) -> Vec<Col> {
    let spare = SPARE
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    match spare {
        Some(mut v) if v.capacity() <= fitting(capacity) => {
            v.reserve(capacity);
            v
        }
        _ => Vec::with_capacity(capacity),
    }
}

/// The most room a spare taken for `capacity` values may have.
fn fitting(capacity: usize) -> usize {
    capacity.saturating_mul(2).max(8)
}

/// Keeps `values`' allocation for [`take`], its values dropped; or frees it, when enough are
/// kept, it is too large, or the thread is ending.
pub(crate) fn give_back(mut values: Vec<Col>) {
    if values.capacity() == 0 || values.capacity() > MAX_KEPT_CAPACITY {
        return;
    }
    values.clear();
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.len() < MAX_SPARE {
                s.push(values);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_given_back_is_taken_again_empty() {
        let mut v = take(5);
        v.push(Col::Text { start: 0, end: 1 });
        let at = v.as_ptr();
        give_back(v);
        let again = take(3);
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at);
        assert!(again.capacity() >= 5);
    }

    #[test]
    fn a_narrow_row_does_not_take_a_wide_rows_vector() {
        while SPARE.with_borrow_mut(|s| s.pop()).is_some() {}
        give_back(Vec::with_capacity(60));
        assert!(take(6).capacity() < 60);
    }

    #[test]
    fn a_wide_vector_is_not_kept() {
        while SPARE.with_borrow_mut(|s| s.pop()).is_some() {}
        give_back(Vec::with_capacity(MAX_KEPT_CAPACITY + 1));
        assert_eq!(SPARE.with_borrow(Vec::len), 0);
    }

    #[test]
    fn at_most_max_spare_are_kept() {
        for _ in 0..MAX_SPARE + 10 {
            give_back(Vec::with_capacity(4));
        }
        assert_eq!(SPARE.with_borrow(Vec::len), MAX_SPARE);
    }
}
