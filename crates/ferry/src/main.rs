//! The `ferry` binary: see `ferry --help`.
fn main() -> std::process::ExitCode {
    ferry::cli::main()
}
