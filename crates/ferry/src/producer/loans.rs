//! What Ferry lends librdkafka with each record: the record's key in the relay (the report's
//! opaque) and a copy of its value, in a buffer Ferry owns and takes back with the report.
//!
//! librdkafka copies a value it is not lent (`RD_KAFKA_MSG_F_COPY`) into one allocation with its
//! message: ~1.3 KB for a 1 KB row, a request past glibc's per-thread cache, and one that first
//! consolidates every small chunk freed since the last one (the delivery reports free a produce
//! response's records together). Here the value is copied once by Ferry, into a buffer of a
//! size class, and librdkafka reads it from there (`RD_KAFKA_MSG_F_COPY` off): its message is
//! then a small allocation. The report gives the buffer back to its class's free list, and the
//! next record of that size takes it; so after the first in-flight window nothing is allocated
//! for a value, and nothing is freed.
//!
//! **The buffer lives exactly as long as librdkafka's copy would have:** until the message's
//! delivery report, the one point after which librdkafka never reads a message again (it
//! destroys the message right after). A buffer is taken back only by its report, or by the
//! failed call that never handed it over. One whose report never comes (librdkafka destroys
//! what a client still holds when the client goes) is freed when the loans are dropped, which is
//! after `rd_kafka_destroy` returns: [`super::client::Client`] holds them after its producer.
//!
//! Each buffer starts with a header: the record's key and the buffer's class. The opaque that
//! travels with the message is the buffer's address, so a report finds the key, the class and
//! the buffer without a lookup. A record whose value is not lent (none, or one larger than
//! [`LEND_MAX`], which librdkafka copies as before) takes a buffer of the header alone.
//!
//! Memory: the buffers in flight are bounded by the in-flight window, as librdkafka's copies
//! were, plus their rounding to a class (at most 127 bytes up to 4 KiB, 2 KiB above). The free
//! lists keep at most [`SPARE_BYTES`]; a buffer given back past that is freed.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

/// Values up to this size are lent; larger ones are copied by librdkafka (a buffer of this size
/// per record would be the same allocation, and the rounding would waste more).
pub(super) const LEND_MAX: usize = 64 * 1024;

/// The most the free lists keep, in bytes of buffer.
pub(super) const SPARE_BYTES: usize = 4 * 1024 * 1024;

/// Size classes: `SMALL_STEP` bytes apart up to `SMALL_MAX`, `LARGE_STEP` apart up to
/// [`LEND_MAX`]. Class 0 is the header alone.
const SMALL_STEP: usize = 128;
const SMALL_MAX: usize = 4096;
const LARGE_STEP: usize = 2048;
const SMALL_CLASSES: usize = SMALL_MAX / SMALL_STEP;
const CLASSES: usize = 1 + SMALL_CLASSES + (LEND_MAX - SMALL_MAX) / LARGE_STEP;

/// A buffer's start. The value, if any, follows it.
#[repr(C)]
struct Header {
    /// The record's key while lent; the next free buffer of the class while free.
    key_or_next: usize,
    class: u32,
    /// The buffer's place in [`Pool::all`].
    place: u32,
}

const HEADER: usize = std::mem::size_of::<Header>();
const ALIGN: usize = 16;

/// The class of a value of `len` bytes, if it is lent.
fn class_of(len: usize) -> Option<usize> {
    if len == 0 {
        Some(0)
    } else if len <= SMALL_MAX {
        Some(len.div_ceil(SMALL_STEP))
    } else if len <= LEND_MAX {
        Some(SMALL_CLASSES + (len - SMALL_MAX).div_ceil(LARGE_STEP))
    } else {
        None
    }
}

/// The value bytes a buffer of `class` holds.
fn capacity(class: usize) -> usize {
    if class <= SMALL_CLASSES {
        class * SMALL_STEP
    } else {
        SMALL_MAX + (class - SMALL_CLASSES) * LARGE_STEP
    }
}

fn layout(class: usize) -> Layout {
    Layout::from_size_align(HEADER + capacity(class), ALIGN).expect("a class's layout is valid")
}

/// A record's loan, for `rd_kafka_produceva`.
pub(super) struct Loan {
    /// The message's opaque: the buffer's address. Given back with [`Loans::give_back`].
    pub opaque: *mut std::ffi::c_void,
    /// Where librdkafka reads the value: Ferry's copy if it was lent (then without
    /// `RD_KAFKA_MSG_F_COPY`), else the caller's bytes (with it). `None`: a null value.
    pub value: Option<(*const u8, usize)>,
    /// Whether the value is the caller's, for librdkafka to copy.
    pub copy: bool,
}

/// The buffers of one client (see the module essay).
pub(super) struct Loans {
    pool: Mutex<Pool>,
}

struct Pool {
    /// The first free buffer of each class (the rest are linked through their headers).
    free: [Option<NonNull<Header>>; CLASSES],
    /// Bytes of the free buffers.
    spare_bytes: usize,
    /// Every buffer allocated and not yet freed: lent or free.
    all: Vec<NonNull<Header>>,
}

// SAFETY: the buffers are plain memory owned by the pool (lent ones are read by librdkafka's
// threads, which the module essay's rule keeps within their loan); every access to the pool's
// lists is under its mutex.
#[allow(unsafe_code)]
unsafe impl Send for Pool {}

impl Default for Loans {
    fn default() -> Loans {
        Loans {
            pool: Mutex::new(Pool {
                free: [None; CLASSES],
                spare_bytes: 0,
                all: Vec::new(),
            }),
        }
    }
}

impl Loans {
    fn lock(&self) -> MutexGuard<'_, Pool> {
        // Every change to the pool is whole before anything that can panic.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer holding `key` and, if it is lent, a copy of `value`.
    #[allow(unsafe_code)]
    pub fn lend(&self, key: usize, value: Option<&[u8]>) -> Loan {
        let lent = value.and_then(|v| class_of(v.len()).map(|c| (v, c)));
        let class = lent.map_or(0, |(_, c)| c);
        let buffer = self.lock().take(class);
        // SAFETY: `buffer` is ours alone until it is handed over, and holds a header and
        // `capacity(class)` bytes, at least the value's length.
        unsafe {
            (*buffer.as_ptr()).key_or_next = key;
            let start = buffer.as_ptr().cast::<u8>().add(HEADER);
            match lent {
                Some((v, _)) => {
                    std::ptr::copy_nonoverlapping(v.as_ptr(), start, v.len());
                    Loan {
                        opaque: buffer.as_ptr().cast(),
                        value: Some((start.cast_const(), v.len())),
                        copy: false,
                    }
                }
                None => Loan {
                    opaque: buffer.as_ptr().cast(),
                    value: value.map(|v| (v.as_ptr(), v.len())),
                    copy: value.is_some(),
                },
            }
        }
    }

    /// Takes back the buffer of `opaque` (its message's report came, or the message was never
    /// accepted); its key.
    ///
    /// # Safety
    /// `opaque` is a [`Loan::opaque`] of these loans, given back once, and librdkafka no longer
    /// reads its value.
    #[allow(unsafe_code)]
    pub unsafe fn give_back(&self, opaque: *mut std::ffi::c_void) -> usize {
        // SAFETY: the caller's.
        unsafe { self.lock().give_back(opaque) }
    }

    /// [`Loans::give_back`] for many, under one lock: the caller gives each back through the
    /// returned guard.
    pub fn taking_back(&self) -> TakingBack<'_> {
        TakingBack(self.lock())
    }
}

/// The loans' pool, held for a run of [`TakingBack::give_back`]s (one report event's records).
pub(super) struct TakingBack<'a>(MutexGuard<'a, Pool>);

impl TakingBack<'_> {
    /// As [`Loans::give_back`].
    ///
    /// # Safety
    /// As [`Loans::give_back`].
    #[allow(unsafe_code)]
    pub unsafe fn give_back(&mut self, opaque: *mut std::ffi::c_void) -> usize {
        // SAFETY: the caller's.
        unsafe { self.0.give_back(opaque) }
    }
}

impl Pool {
    /// A free buffer of `class`, or a new one.
    #[allow(unsafe_code)]
    fn take(&mut self, class: usize) -> NonNull<Header> {
        if let Some(buffer) = self.free[class] {
            // SAFETY: a free buffer of this pool: its header links the next free one.
            let next = unsafe { (*buffer.as_ptr()).key_or_next };
            self.free[class] = NonNull::new(next as *mut Header);
            self.spare_bytes -= capacity(class);
            return buffer;
        }
        let layout = layout(class);
        // SAFETY: the layout has a non-zero size (the header).
        let raw = unsafe { alloc(layout) }.cast::<Header>();
        let Some(buffer) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        let place = u32::try_from(self.all.len()).expect("fewer than 2^32 records in flight");
        // SAFETY: freshly allocated, aligned for the header.
        unsafe {
            buffer.as_ptr().write(Header {
                key_or_next: 0,
                class: class as u32,
                place,
            })
        };
        self.all.push(buffer);
        buffer
    }

    /// # Safety
    /// As [`Loans::give_back`].
    #[allow(unsafe_code)]
    unsafe fn give_back(&mut self, opaque: *mut std::ffi::c_void) -> usize {
        let buffer = NonNull::new(opaque.cast::<Header>()).expect("a loan's opaque is not null");
        // SAFETY: a lent buffer of this pool (the caller's promise): its header is whole, and
        // it is ours again.
        let header = unsafe { &mut *buffer.as_ptr() };
        let key = header.key_or_next;
        let class = header.class as usize;
        if self.spare_bytes + capacity(class) <= SPARE_BYTES {
            header.key_or_next = self.free[class].map_or(0, |b| b.as_ptr() as usize);
            self.free[class] = Some(buffer);
            self.spare_bytes += capacity(class);
        } else {
            let place = header.place as usize;
            self.all.swap_remove(place);
            if let Some(moved) = self.all.get(place) {
                // SAFETY: another buffer of this pool; only its place changes.
                unsafe { (*moved.as_ptr()).place = place as u32 };
            }
            // SAFETY: allocated by `take` with this class's layout, and no longer listed.
            unsafe { dealloc(buffer.as_ptr().cast(), layout(class)) };
        }
        key
    }
}

impl Drop for Pool {
    /// Frees every buffer, lent or free: librdkafka has destroyed what it still held (see the
    /// module essay).
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        for buffer in self.all.drain(..) {
            // SAFETY: allocated by `take` with its class's layout; freed once, here.
            unsafe {
                let class = (*buffer.as_ptr()).class as usize;
                dealloc(buffer.as_ptr().cast(), layout(class));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[allow(unsafe_code)]
    fn read(loan: &Loan) -> Option<Vec<u8>> {
        // SAFETY: a loan not yet given back.
        loan.value
            .map(|(p, n)| unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
    }

    #[test]
    fn classes_cover_every_lent_length_with_little_to_spare() {
        assert_eq!(class_of(0), Some(0));
        for len in 1..=LEND_MAX {
            let class = class_of(len).expect("lent");
            assert!(class < CLASSES);
            let cap = capacity(class);
            assert!(cap >= len, "{len} in class {class} of {cap}");
            let step = if len <= SMALL_MAX {
                SMALL_STEP
            } else {
                LARGE_STEP
            };
            assert!(cap - len < step, "{len} in class {class} of {cap}");
        }
        assert_eq!(class_of(LEND_MAX + 1), None);
        assert_eq!(capacity(CLASSES - 1), LEND_MAX);
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_large_value_and_a_null_one_are_not_lent_and_keep_their_key() {
        let loans = Loans::default();
        let large = vec![7u8; LEND_MAX + 1];
        let loan = loans.lend(3, Some(&large));
        assert!(loan.copy);
        assert_eq!(loan.value, Some((large.as_ptr(), large.len())));
        let null = loans.lend(4, None);
        assert!(!null.copy && null.value.is_none());
        let empty = loans.lend(5, Some(b""));
        assert!(!empty.copy);
        assert_eq!(read(&empty).as_deref(), Some(&b""[..]));
        // SAFETY: loans of `loans`, each given back once.
        unsafe {
            assert_eq!(loans.give_back(null.opaque), 4);
            assert_eq!(loans.give_back(loan.opaque), 3);
            assert_eq!(loans.give_back(empty.opaque), 5);
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_buffer_given_back_is_lent_again_to_the_next_value_of_its_class() {
        let loans = Loans::default();
        let first = loans.lend(1, Some(&[1; 1000]));
        // SAFETY: given back once.
        assert_eq!(unsafe { loans.give_back(first.opaque) }, 1);
        let second = loans.lend(2, Some(&[2; 1010]));
        assert_eq!(second.opaque, first.opaque);
        assert_eq!(read(&second), Some(vec![2; 1010]));
        let other_class = loans.lend(3, Some(&[3; 2000]));
        assert_ne!(other_class.opaque, first.opaque);
        assert_eq!(loans.lock().all.len(), 2);
    }

    #[test]
    #[allow(unsafe_code)]
    fn buffers_given_back_past_the_spare_bytes_are_freed() {
        let loans = Loans::default();
        let value = vec![9u8; LEND_MAX];
        let n = SPARE_BYTES / LEND_MAX + 3;
        let lent: Vec<Loan> = (0..n).map(|k| loans.lend(k, Some(&value))).collect();
        for (k, loan) in lent.iter().enumerate() {
            // SAFETY: each given back once.
            assert_eq!(unsafe { loans.give_back(loan.opaque) }, k);
        }
        let pool = loans.lock();
        assert_eq!(pool.spare_bytes, SPARE_BYTES);
        assert_eq!(pool.all.len(), SPARE_BYTES / LEND_MAX);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Lend(usize),
        /// Gives back the loan at this index (modulo those outstanding).
        GiveBack(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..3 * SMALL_MAX).prop_map(Step::Lend),
            (0..LEND_MAX + 10).prop_map(Step::Lend),
            any::<usize>().prop_map(Step::GiveBack),
        ]
    }

    proptest! {
        /// Whatever the order of loans and returns, every outstanding loan still reads its own
        /// bytes, every return gives its key, and the pool's books balance: a buffer is never
        /// lent twice at once.
        #[test]
        #[allow(unsafe_code)]
        fn a_lent_value_stays_whole_until_it_is_given_back(
            steps in proptest::collection::vec(step(), 1..300)
        ) {
            let loans = Loans::default();
            let mut out: Vec<(usize, Loan, Vec<u8>)> = Vec::new();
            for (key, s) in steps.into_iter().enumerate() {
                match s {
                    Step::Lend(len) => {
                        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + key) as u8).collect();
                        let loan = loans.lend(key, Some(&bytes));
                        prop_assert!(!out.iter().any(|(_, l, _)| l.opaque == loan.opaque));
                        out.push((key, loan, bytes));
                    }
                    Step::GiveBack(i) if !out.is_empty() => {
                        let (key, loan, bytes) = out.swap_remove(i % out.len());
                        prop_assert_eq!(read(&loan), Some(bytes));
                        // SAFETY: each loan given back once.
                        prop_assert_eq!(unsafe { loans.give_back(loan.opaque) }, key);
                    }
                    Step::GiveBack(_) => {}
                }
                for (_, loan, bytes) in &out {
                    prop_assert_eq!(read(loan), Some(bytes.clone()));
                }
            }
            let pool = loans.lock();
            let free: usize = (0..CLASSES)
                .map(|c| {
                    let mut n = 0;
                    let mut at = pool.free[c];
                    while let Some(b) = at {
                        n += 1;
                        // SAFETY: a free buffer of the pool.
                        at = NonNull::new(unsafe { (*b.as_ptr()).key_or_next } as *mut Header);
                    }
                    n
                })
                .sum();
            prop_assert_eq!(free + out.len(), pool.all.len());
            for (place, b) in pool.all.iter().enumerate() {
                // SAFETY: a buffer of the pool.
                prop_assert_eq!(unsafe { (*b.as_ptr()).place } as usize, place);
            }
        }
    }
}
