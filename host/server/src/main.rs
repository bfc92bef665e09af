//! The `wisp` command.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use wisp_server::settings::{Cli, Command};
use wisp_server::Server;

fn init_logging(verbose: u8, info: bool) {
    let level = match (verbose, info) {
        (0, false) => "warn",
        (0, true) => "info",
        (1, _) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("WISP_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!("warn,wisp_server={level},wisp_core={level},wisp_scheduler={level},wisp_backend_onnx={level},wisp={level}"))
    });
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let Command::Serve(settings) = cli.command;
    init_logging(settings.log_verbose, settings.log_info);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wisp-io")
        .build()?;
    rt.block_on(async move {
        let server = Server::start(settings).await?;
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        server.shutdown().await?;
        tracing::info!("stopped");
        Ok(())
    })
}
