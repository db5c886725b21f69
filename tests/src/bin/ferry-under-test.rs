//! The `ferry` binary, built inside the end-to-end test crate so tests can spawn it.
fn main() -> std::process::ExitCode {
    ferry::cli::main()
}
