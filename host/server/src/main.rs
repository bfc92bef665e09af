//! The `wisp` command (see `wisp_server::cli`).

fn main() -> anyhow::Result<()> {
    wisp_server::cli::main()
}
