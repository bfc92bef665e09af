//! The `wisp` command line: parse flags, set up logging, serve until SIGINT/SIGTERM. `main.rs`
//! is a one-line call to [`main`], so test harnesses can run the very same program.

use crate::settings::{Cli, Command};
use crate::Server;
use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use tracing_subscriber::EnvFilter;

fn init_logging(settings: &crate::settings::Settings) -> anyhow::Result<()> {
    use tracing_subscriber::prelude::*;
    let initial = crate::logging::LogSettings {
        log_file: String::new(),
        log_info: settings.log_info,
        log_warning: settings.log_warning,
        log_error: settings.log_error,
        log_verbose_level: settings.log_verbose as u64,
        log_format: settings.log_format.clone(),
    };
    let filter =
        EnvFilter::try_from_env("WISP_LOG").unwrap_or_else(|_| EnvFilter::new(initial.filter()));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    match &settings.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open --log-file {}", path.display()))?;
            registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(std::sync::Mutex::new(file)),
                )
                .init();
        }
        None => registry.with(tracing_subscriber::fmt::layer()).init(),
    }
    crate::logging::install_filter_setter(Box::new(move |f| {
        let _ = handle.modify(|current| *current = EnvFilter::new(f));
    }));
    Ok(())
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

/// `wisp sign`: writes the signed manifest of each version.
fn sign(args: crate::settings::SignArgs) -> anyhow::Result<()> {
    let key = crate::signing::read_secret_key(&args.key).map_err(anyhow::Error::msg)?;
    let versions = if args.versions.is_empty() {
        wisp_core::repository::versions(&args.model_dir)
    } else {
        args.versions
    };
    anyhow::ensure!(
        !versions.is_empty(),
        "{} has no version directory",
        args.model_dir.display()
    );
    for v in versions {
        crate::signing::sign(&args.model_dir, v, &key)
            .with_context(|| format!("cannot sign version {v} of {}", args.model_dir.display()))?;
        println!("signed {}/{v}", args.model_dir.display());
    }
    Ok(())
}

/// `wisp keygen`: a new key pair, the secret readable by its owner only.
fn keygen(args: crate::settings::KeygenArgs) -> anyhow::Result<()> {
    let (secret, public) = crate::signing::generate_key()?;
    let secret_path = args.out.with_extension("key");
    let public_path = args.out.with_extension("pub");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(&secret_path)
        .with_context(|| format!("cannot create {}", secret_path.display()))?;
    std::io::Write::write_all(&mut f, format!("{secret}\n").as_bytes())?;
    std::fs::write(&public_path, format!("{public}\n"))?;
    println!(
        "{} (secret) and {} (public)",
        secret_path.display(),
        public_path.display()
    );
    Ok(())
}

/// Runs `wisp` with the process arguments.
pub fn main() -> anyhow::Result<()> {
    // `wisp --version` (or `-V`) reports the build and what it can run here; clap's own flag
    // would print the version alone.
    if let Some(flag) = std::env::args_os().nth(1) {
        if (flag == "--version" || flag == "-V") && std::env::args_os().nth(2).is_none() {
            print!("{}", crate::version::report(&wisp_core::env::ProcessEnv));
            return Ok(());
        }
    }
    let cli = Cli::parse();
    let settings = match cli.command {
        Command::Serve(settings) => settings,
        Command::Sign(args) => return sign(args),
        Command::Keygen(args) => return keygen(args),
        Command::Quantize(args) => {
            if let Err(e) = crate::quantize::run(&args) {
                eprintln!("wisp quantize: {e:#}");
                std::process::exit(1);
            }
            return Ok(());
        }
        Command::Plugin(cmd) => {
            // One clear line, never a backtrace (whatever RUST_BACKTRACE holds): these are
            // a plugin author's mistakes and missing tools, not Wisp's bugs.
            if let Err(e) = crate::plugin_cli::run(cmd) {
                eprintln!("wisp plugin: {e:#}");
                std::process::exit(1);
            }
            return Ok(());
        }
    };
    // Before any thread starts (tokio's, the loaders', the instances').
    let arenas = crate::alloc::limit_arenas(&*settings.env);
    init_logging(&settings)?;
    if let Some(n) = arenas {
        tracing::debug!(arenas = n, "malloc arenas capped at the number of cores");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wisp-io")
        .build()?;
    let stall = std::time::Duration::from_secs(settings.instance_stall_secs);
    let served = rt.block_on(async move {
        let server = Server::start(settings).await?;
        let systemd: Arc<dyn crate::systemd::Notifier> = Arc::new(crate::systemd::Systemd);
        let models = server.registry().models().len();
        crate::systemd::ready(&*systemd, &format!("serving {models} models"));
        let watchdog = crate::systemd::watchdog_period().map(|period| {
            tracing::info!(
                period_ms = period.as_millis() as u64,
                stall_secs = stall.as_secs(),
                "systemd watchdog on: pinging while no instance is stuck"
            );
            crate::systemd::spawn_watchdog(
                period,
                crate::systemd::registry_check(server.registry().clone(), stall),
                systemd.clone(),
            )
        });
        shutdown_signal().await;
        crate::systemd::stopping(&*systemd);
        tracing::info!("shutting down: finishing in-flight requests");
        server.shutdown().await?;
        if let Some(w) = watchdog {
            w.abort();
        }
        tracing::info!("stopped");
        Ok(())
    });
    // `Server::shutdown` kept to `--exit-timeout-secs`; blocking work still running now (a
    // load, a drain that never ends) is not waited for, as dropping the runtime would.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    served
}
