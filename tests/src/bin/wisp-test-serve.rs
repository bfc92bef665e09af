//! The `wisp` program itself, built inside this package so integration tests can start it as a
//! separate process (`CARGO_BIN_EXE_wisp-test-serve`) and observe it from outside (its memory).

fn main() -> anyhow::Result<()> {
    wisp_server::cli::main()
}
