//! Spare tuple vectors, kept per thread: a tuple's columns go back here when the tuple is
//! dropped ([`super::Tuple`]), and the next tuple decoded takes one.
//!
//! The reader decodes ahead of the pipeline (up to its channel's byte budget), and each row's
//! vector of columns was a fresh allocation: past glibc's per-thread cache (seven chunks of a
//! size), so through its bins, and freed the same way, ~270 instructions a row in all. A spare
//! vector costs a thread-local lookup and a push or a pop.

use std::cell::RefCell;

use super::Col;

/// Spare vectors kept per thread. The reader runs ahead of the pipeline by up to its channel's
/// byte budget (2 MiB, ~2,000 rows of 1 KB), and every row in flight holds a vector: with fewer
/// spares than that, a burst's later rows were fresh allocations again.
const MAX_SPARE: usize = 4096;
/// The most columns the spares may have room for in all (~384 KiB): the bound for wide tables.
const MAX_SPARE_COLUMNS: usize = 32 * 1024;
/// A vector with room for more values than this (a wide table's) is not kept.
const MAX_KEPT_CAPACITY: usize = 64;

#[derive(Default)]
struct Spares {
    vectors: Vec<Vec<Col>>,
    /// The capacities of `vectors`, summed.
    columns: usize,
}

thread_local! {
    static SPARE: RefCell<Spares> = RefCell::new(Spares::default());
}

/// An empty vector with room for `capacity` values: a spare one if there is one of about that
/// size (with outbox tables of different widths, a narrow row does not keep a wide row's room).
pub(crate) fn take(capacity: usize) -> Vec<Col> {
    let spare = SPARE
        .try_with(|s| {
            s.try_borrow_mut().ok().and_then(|mut s| {
                let v = s.vectors.pop()?;
                s.columns -= v.capacity();
                Some(v)
            })
        })
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
    let capacity = values.capacity();
    if capacity == 0 || capacity > MAX_KEPT_CAPACITY {
        return;
    }
    values.clear();
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.vectors.len() < MAX_SPARE && s.columns + capacity <= MAX_SPARE_COLUMNS {
                s.columns += capacity;
                s.vectors.push(values);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() {
        SPARE.with_borrow_mut(|s| *s = Spares::default());
    }

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
        empty();
        give_back(Vec::with_capacity(60));
        assert!(take(6).capacity() < 60);
    }

    #[test]
    fn a_wide_vector_is_not_kept() {
        empty();
        give_back(Vec::with_capacity(MAX_KEPT_CAPACITY + 1));
        assert_eq!(SPARE.with_borrow(|s| s.vectors.len()), 0);
    }

    #[test]
    fn at_most_max_spare_are_kept() {
        empty();
        for _ in 0..MAX_SPARE + 10 {
            give_back(Vec::with_capacity(4));
        }
        assert_eq!(SPARE.with_borrow(|s| s.vectors.len()), MAX_SPARE);
    }

    #[test]
    fn wide_spares_are_kept_up_to_max_spare_columns() {
        empty();
        for _ in 0..MAX_SPARE {
            give_back(Vec::with_capacity(MAX_KEPT_CAPACITY));
        }
        let (kept, columns) = SPARE.with_borrow(|s| (s.vectors.len(), s.columns));
        assert_eq!(kept, MAX_SPARE_COLUMNS / MAX_KEPT_CAPACITY);
        assert_eq!(columns, kept * MAX_KEPT_CAPACITY);
        let v = take(MAX_KEPT_CAPACITY);
        assert_eq!(SPARE.with_borrow(|s| s.columns), columns - v.capacity());
    }
}
