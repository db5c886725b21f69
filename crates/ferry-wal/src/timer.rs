//! A one-shot timer on the tokio runtime's poller, finer than tokio's own timers (whose wheel
//! counts whole milliseconds): the reader's pause inside a transaction lasts a fraction of one
//! (`conn::pause::Pause`), and so does the producer's wait for a transaction's delivery
//! reports to come together (`ferry::producer`). On Linux it is a `timerfd`; elsewhere there is
//! none, and the callers do without.
//!
//! The timer may be set from any thread (librdkafka's threads set the producer's), and the
//! wait for it is a task of the runtime that made it.

use std::time::Duration;

/// A one-shot timer (see the module essay).
#[derive(Debug)]
pub struct Timer {
    #[cfg(target_os = "linux")]
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
impl Timer {
    /// A new, unset timer, or `None` where there is none. Must be called within a tokio
    /// runtime; [`Timer::over`] must be awaited on that runtime.
    pub fn new() -> Option<Self> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: plain system call; a non-negative result is a new descriptor we own.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an `OwnedFd` is a valid open descriptor, closed only when it is dropped,
        // which the `AsyncFd` owning it does last; its `as_raw_fd` never changes.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .ok()?;
        Some(Timer { fd })
    }

    /// Sets the timer to run out `after` from now (at least a nanosecond later), or unsets it
    /// (zero). Either way, an end that passed unread is forgotten. False if the kernel refused
    /// (the caller then does not wait for it).
    pub fn set(&self, after: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs().try_into().unwrap_or(libc::time_t::MAX),
                tv_nsec: after.subsec_nanos().into(),
            },
        };
        // SAFETY: our open timerfd, a valid itimerspec, and no old value asked for.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        rc == 0
    }

    /// Waits until the timer set last has run out. Cancel-safe: a wait dropped before the end
    /// leaves the timer running, and one dropped after it leaves the end to be read by the next
    /// wait or forgotten by the next [`Timer::set`].
    pub async fn over(&self) {
        use std::os::fd::AsRawFd;
        loop {
            let Ok(mut ready) = self.fd.readable().await else {
                // The poller refused the descriptor: nothing will wake this wait, so it ends
                // at once (a wait cut short, never a caller stuck).
                return;
            };
            let mut expirations = [0u8; 8];
            let read = ready.try_io(|fd| {
                // SAFETY: reads at most 8 bytes into an 8-byte buffer from our open timerfd.
                let n = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        expirations.as_mut_ptr().cast(),
                        expirations.len(),
                    )
                };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                // Nothing yet (or an end forgotten by a later set): wait again.
                Err(_would_block) => continue,
                Ok(Ok(())) => {
                    // Read empty: the next wait need not try a read to learn so (a later end
                    // comes as a new readiness event, which this does not clear).
                    ready.clear_ready();
                    return;
                }
                // A read error other than "not yet" cannot be waited out.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(_)) => return,
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Timer {
    pub fn new() -> Option<Self> {
        None
    }

    pub fn set(&self, _after: Duration) -> bool {
        false
    }

    pub async fn over(&self) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn runs_out_after_each_set() {
        let timer = Timer::new().expect("timerfd");
        for _ in 0..3 {
            let set = std::time::Instant::now();
            assert!(timer.set(Duration::from_micros(200)));
            tokio::time::timeout(DEADLINE, timer.over())
                .await
                .expect("the timer runs out");
            // Never before its end (the kernel's timer never fires early).
            assert!(set.elapsed() >= Duration::from_micros(200));
        }
    }

    /// Waits, without reading it, until the timer has run out.
    fn wait_unread(timer: &Timer) {
        let mut fds = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(timer.fd.get_ref()),
            events: libc::POLLIN,
            revents: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: one valid pollfd for our open timerfd.
        let n = unsafe { libc::poll(&mut fds, 1, 30_000) };
        assert_eq!(n, 1, "the timer ran out within the deadline");
    }

    #[tokio::test]
    async fn a_set_forgets_an_end_nobody_read() {
        let timer = Timer::new().expect("timerfd");
        assert!(timer.set(Duration::from_nanos(1)));
        // The first end passes unread; the runtime may already have seen it.
        tokio::time::timeout(DEADLINE, timer.over())
            .await
            .expect("the timer runs out");
        assert!(timer.set(Duration::from_nanos(1)));
        wait_unread(&timer);
        // Set again with a long end: the old, unread end does not count.
        assert!(timer.set(Duration::from_secs(3600)));
        let waited = tokio::time::timeout(Duration::from_millis(50), timer.over()).await;
        assert!(waited.is_err(), "an end that was forgotten ended the wait");
    }

    #[tokio::test]
    async fn an_unset_timer_never_runs_out() {
        let timer = Timer::new().expect("timerfd");
        assert!(timer.set(Duration::from_millis(5)));
        assert!(timer.set(Duration::ZERO));
        // An end that passed unread before the unset is forgotten too.
        assert!(timer.set(Duration::from_millis(5)));
        wait_unread(&timer);
        assert!(timer.set(Duration::ZERO));
        let waited = tokio::time::timeout(Duration::from_millis(50), timer.over()).await;
        assert!(waited.is_err(), "an unset timer ended a wait");
        // And it is set again.
        assert!(timer.set(Duration::from_millis(5)));
        tokio::time::timeout(DEADLINE, timer.over())
            .await
            .expect("the timer runs out");
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_the_timer_running() {
        // Long enough that a test thread held up on a busy machine still polls before the end.
        let timer = Timer::new().expect("timerfd");
        assert!(timer.set(Duration::from_secs(2)));
        tokio::select! {
            biased;
            () = timer.over() => panic!("ran out before its end"),
            () = std::future::ready(()) => {}
        }
        tokio::time::timeout(DEADLINE, timer.over())
            .await
            .expect("the timer runs out");
    }

    /// The producer's timer is set on librdkafka's threads while the runtime's thread waits.
    #[tokio::test]
    async fn a_timer_set_on_another_thread_ends_the_wait() {
        let timer = std::sync::Arc::new(Timer::new().expect("timerfd"));
        let setter = timer.clone();
        let thread = std::thread::spawn(move || assert!(setter.set(Duration::from_micros(100))));
        tokio::time::timeout(DEADLINE, timer.over())
            .await
            .expect("the timer runs out");
        thread.join().expect("the setter");
    }
}
