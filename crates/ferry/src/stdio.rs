//! Printing for the subcommands that never panics on a closed pipe.
//!
//! `println!` panics when stdout is a pipe whose reader has gone (`ferry status | head -1`): Rust
//! ignores SIGPIPE, so the write returns `EPIPE` and the macro turns that into a panic (exit 101,
//! and a second panic printing the first to a closed stderr aborts with 134). Instead:
//!
//! - [`outln!`]/[`out!`] write to stdout and flush; if that fails, the process ends at once with
//!   exit code [`STDOUT_CLOSED`] and no message (nobody is left to read the rest of the output).
//! - [`errln!`] writes to stderr and ignores failure: the exit code still says what happened.
//!
//! `ferry run` prints nothing to stdout; its logs go through `telemetry::logging`, which drops and
//! counts what it cannot write.

use std::fmt;
use std::io::{self, Write};

/// Exit code when standard output fails mid-command: 128 + SIGPIPE, what a shell reports for a
/// program stopped by a closed pipe, so `set -o pipefail` scripts read it the same way.
pub const STDOUT_CLOSED: i32 = 141;

/// Writes `args` to stdout; exits with [`STDOUT_CLOSED`] if stdout cannot take them.
pub fn write_out(args: fmt::Arguments<'_>) {
    let mut stdout = io::stdout().lock();
    if stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(STDOUT_CLOSED);
    }
}

/// Writes `args` to stderr; a failure is ignored.
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// `println!` that exits quietly with [`STDOUT_CLOSED`] instead of panicking.
macro_rules! outln {
    () => { $crate::stdio::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdio::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that exits quietly with [`STDOUT_CLOSED`] instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdio::write_out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::stdio::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
