//! A one-shot timer finer than tokio's, for the reader's pause inside a transaction (see
//! `stream::Task::pause_inside_transaction`): tokio's timer wheel counts whole milliseconds, and
//! the pause is a fraction of one. On Linux it is a `timerfd` watched by the runtime's poller;
//! elsewhere there is none, and the reader does not pause.

use std::time::Duration;

/// A one-shot timer on the runtime's poller.
#[derive(Debug)]
pub(crate) struct Pause {
    #[cfg(target_os = "linux")]
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
impl Pause {
    /// A new timer, or `None` where there is none (the reader then reads without pausing).
    /// Must be called within a tokio runtime.
    pub(crate) fn new() -> Option<Self> {
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
        Some(Pause { fd })
    }

    /// Starts the timer: [`Pause::over`] returns `after` from now. Starting it again moves the
    /// end, and forgets an end that passed unread. False if the kernel refused (the caller
    /// then does not wait for it).
    pub(crate) fn start(&mut self, after: Duration) -> bool {
        use std::os::fd::AsRawFd;
        // A zero value would disarm the timer; the shortest pause is a nanosecond.
        let after = after.max(Duration::from_nanos(1));
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

    /// Waits until the timer started last has run out. Cancel-safe: a wait dropped before the
    /// end leaves the timer running, and one dropped after it leaves the end to be read by
    /// the next wait or forgotten by the next [`Pause::start`].
    pub(crate) async fn over(&mut self) {
        use std::os::fd::AsRawFd;
        loop {
            let Ok(mut ready) = self.fd.readable_mut().await else {
                // The poller refused the descriptor: nothing will wake this wait, so it ends
                // at once (a pause cut short, never a reader stuck).
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
                // Nothing yet (or an end forgotten by a later start): wait again.
                Err(_would_block) => continue,
                Ok(Ok(())) => return,
                // A read error other than "not yet" cannot be waited out.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(_)) => return,
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Pause {
    pub(crate) fn new() -> Option<Self> {
        None
    }

    pub(crate) fn start(&mut self, _after: Duration) -> bool {
        false
    }

    pub(crate) async fn over(&mut self) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn ends_after_each_start() {
        let mut pause = Pause::new().expect("timerfd");
        for _ in 0..3 {
            let started = std::time::Instant::now();
            assert!(pause.start(Duration::from_micros(200)));
            tokio::time::timeout(DEADLINE, pause.over())
                .await
                .expect("the pause ends");
            // Never before its end (the kernel's timer never fires early).
            assert!(started.elapsed() >= Duration::from_micros(200));
        }
    }

    #[tokio::test]
    async fn a_start_forgets_an_end_nobody_read() {
        let mut pause = Pause::new().expect("timerfd");
        assert!(pause.start(Duration::from_nanos(1)));
        // The first end passes unread; the runtime may already have seen it.
        tokio::time::timeout(DEADLINE, pause.over())
            .await
            .expect("the pause ends");
        assert!(pause.start(Duration::from_nanos(1)));
        // Waits until the timer has run out, without reading it.
        let mut fds = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(pause.fd.get_ref()),
            events: libc::POLLIN,
            revents: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: one valid pollfd for our open timerfd.
        let n = unsafe { libc::poll(&mut fds, 1, 30_000) };
        assert_eq!(n, 1, "the timer ran out within the deadline");
        // Started again with a long end: the old, unread end does not count.
        assert!(pause.start(Duration::from_secs(3600)));
        let waited = tokio::time::timeout(Duration::from_millis(50), pause.over()).await;
        assert!(waited.is_err(), "an end that was forgotten ended the pause");
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_the_timer_running() {
        let mut pause = Pause::new().expect("timerfd");
        // Long enough that a test thread held up on a busy machine still polls before the end.
        assert!(pause.start(Duration::from_secs(2)));
        tokio::select! {
            biased;
            () = pause.over() => panic!("ended before its start had run"),
            () = std::future::ready(()) => {}
        }
        tokio::time::timeout(DEADLINE, pause.over())
            .await
            .expect("the pause ends");
    }
}
