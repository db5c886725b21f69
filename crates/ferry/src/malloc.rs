//! glibc malloc settings for a relay's allocation pattern.
//!
//! librdkafka builds every produce request in fresh buffers of up to `batch.size` (1 MB), and the
//! reader reads the socket into 64 KiB chunks. With glibc's defaults (a dynamic mmap threshold
//! starting at 128 KiB, and the top of each heap returned to the kernel once 128 KiB of it is
//! free) those buffers go back to the kernel and come back as fresh pages again and again:
//! page faults (zeroing pages) took about 15% of Ferry's CPU draining a 1 KB-row backlog.
//! Fixing the thresholds keeps them in the heap. Measured on the 200,000-row backlog,
//! alternating runs: 0.82 -> 0.71 CPU-s per 100k rows, peak RSS unchanged within run-to-run
//! spread (bench/README.md). Freed memory above the thresholds still goes back to the kernel.

/// Allocations at least this large are mmapped (not kept in a heap) when freed.
const MMAP_THRESHOLD: i32 = 16 << 20;
/// Free memory at the top of a heap beyond this is returned to the kernel.
const TRIM_THRESHOLD: i32 = 64 << 20;

/// Applies the settings; call first thing in `main`, before any thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() {
    // SAFETY: mallopt only changes allocator parameters; it is called before any other thread
    // exists, so no allocation races with it. A refused setting (return 0) leaves the default.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Other allocators need nothing.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}
