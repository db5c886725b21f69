//! Spare tuple allocations, kept per thread: a tuple's parts (its columns' vector, in one box
//! with its bytes) go back here when the tuple is dropped ([`super::Tuple`]), and the next
//! tuple decoded takes them.
//!
//! The reader decodes ahead of the pipeline (up to its channel's byte budget), and each row's
//! columns were a fresh allocation: past glibc's per-thread cache (seven chunks of a size), so
//! through its bins, and freed the same way, ~270 instructions a row in all. A spare costs a
//! thread-local lookup and a push or a pop.

use std::cell::RefCell;

use bytes::Bytes;

use super::Parts;

/// Spares kept per thread. The reader runs ahead of the pipeline by up to its channel's byte
/// budget (2 MiB, ~2,000 rows of 1 KB), and every row in flight holds its parts: with fewer
/// spares than that, a burst's later rows were fresh allocations again.
const MAX_SPARE: usize = 4096;
/// The most columns the spares may have room for in all (~384 KiB): the bound for wide tables.
const MAX_SPARE_COLUMNS: usize = 32 * 1024;
/// Parts with room for more columns than this (a wide table's) are not kept.
const MAX_KEPT_CAPACITY: usize = 64;

#[derive(Default)]
struct Spares {
    /// Boxes kept as they are: a tuple holds one, and taking it is a pointer's move.
    #[allow(clippy::vec_box)]
    parts: Vec<Box<Parts>>,
    /// The capacities of the spares' column vectors, summed.
    columns: usize,
}

thread_local! {
    static SPARE: RefCell<Spares> = RefCell::new(Spares::default());
}

/// Empty parts with room for `capacity` columns: spare ones if there are some of about that
/// size (with outbox tables of different widths, a narrow row does not keep a wide row's room).
pub(crate) fn take(capacity: usize) -> Box<Parts> {
    let spare = SPARE
        .try_with(|s| {
            s.try_borrow_mut().ok().and_then(|mut s| {
                let p = s.parts.pop()?;
                s.columns -= p.cols.capacity();
                Some(p)
            })
        })
        .ok()
        .flatten();
    match spare {
        Some(mut p) if p.cols.capacity() <= fitting(capacity) => {
            p.cols.reserve(capacity);
            p
        }
        _ => Box::new(Parts {
            data: Bytes::new(),
            cols: Vec::with_capacity(capacity),
        }),
    }
}

/// The most room a spare taken for `capacity` columns may have.
fn fitting(capacity: usize) -> usize {
    capacity.saturating_mul(2).max(8)
}

/// Keeps `parts`' allocations for [`take`], emptied (its bytes released); or frees them, when
/// enough are kept, they are too large, or the thread is ending.
pub(crate) fn give_back(mut parts: Box<Parts>) {
    let capacity = parts.cols.capacity();
    if capacity > MAX_KEPT_CAPACITY {
        return;
    }
    parts.data = Bytes::new();
    parts.cols.clear();
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.parts.len() < MAX_SPARE && s.columns + capacity <= MAX_SPARE_COLUMNS {
                s.columns += capacity;
                s.parts.push(parts);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::Col;
    use super::*;

    fn empty() {
        SPARE.with_borrow_mut(|s| *s = Spares::default());
    }

    fn with_capacity(capacity: usize) -> Box<Parts> {
        Box::new(Parts {
            data: Bytes::new(),
            cols: Vec::with_capacity(capacity),
        })
    }

    fn kept() -> usize {
        SPARE.with_borrow(|s| s.parts.len())
    }

    #[test]
    fn parts_given_back_are_taken_again_empty_and_without_their_bytes() {
        empty();
        let data = Bytes::from(vec![7u8; 100]);
        let mut p = take(5);
        p.cols.push(Col::Text { start: 0, end: 1 });
        p.data = data.clone();
        let (at, cols_at) = (&*p as *const Parts, p.cols.as_ptr());
        give_back(p);
        assert!(data.is_unique(), "a spare holds no message");
        let again = take(3);
        assert!(again.cols.is_empty() && again.data.is_empty());
        assert_eq!(
            (&*again as *const Parts, again.cols.as_ptr()),
            (at, cols_at)
        );
        assert!(again.cols.capacity() >= 5);
    }

    #[test]
    fn a_narrow_row_does_not_take_a_wide_rows_parts() {
        empty();
        give_back(with_capacity(60));
        assert!(take(6).cols.capacity() < 60);
    }

    #[test]
    fn wide_parts_are_not_kept() {
        empty();
        give_back(with_capacity(MAX_KEPT_CAPACITY + 1));
        assert_eq!(kept(), 0);
    }

    #[test]
    fn at_most_max_spare_are_kept() {
        empty();
        for _ in 0..MAX_SPARE + 10 {
            give_back(with_capacity(4));
        }
        assert_eq!(kept(), MAX_SPARE);
    }

    #[test]
    fn wide_spares_are_kept_up_to_max_spare_columns() {
        empty();
        for _ in 0..MAX_SPARE {
            give_back(with_capacity(MAX_KEPT_CAPACITY));
        }
        let (kept, columns) = SPARE.with_borrow(|s| (s.parts.len(), s.columns));
        assert_eq!(kept, MAX_SPARE_COLUMNS / MAX_KEPT_CAPACITY);
        assert_eq!(columns, kept * MAX_KEPT_CAPACITY);
        let p = take(MAX_KEPT_CAPACITY);
        assert_eq!(
            SPARE.with_borrow(|s| s.columns),
            columns - p.cols.capacity()
        );
    }
}
