//! `wisp-server`: the `wisp` binary's library — settings, the protocol-neutral service layer,
//! and the HTTP and gRPC front ends over it; model lifecycle is `wisp-models` (see
//! `ARCHITECTURE.md`).
//!
//! [`Server::start`] loads every model of the repositories (off the async runtime), binds the
//! HTTP listener and serves until [`Server::shutdown`] (or SIGINT/SIGTERM in `main`), which
//! stops accepting, lets in-flight requests finish, then drains and stops every model's
//! scheduler.

mod resolved;

use resolved::Resolved;

pub mod alloc;
pub use wisp_service::cache;
pub mod cli;
pub mod coalesce;
pub mod conn;
pub mod embed;
pub mod grpc;
pub mod http;
pub use wisp_service::logging;
pub mod metrics;
pub mod plugin_cli;
pub mod quantize;
/// Object-store repositories (the `object-store` feature).
#[cfg(feature = "object-store")]
pub use wisp_remote as remote;
pub mod restricted;
pub use wisp_service as service;
pub mod settings;
pub mod systemd;
pub mod tls;
pub mod version;

/// Model lifecycle lives in its own crate, which knows nothing of HTTP, gRPC or Prometheus.
pub use wisp_models as models;
pub use wisp_models::{host_policy, signing};

#[cfg(test)]
mod fuzz;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use models::Registry;
use service::core::{Core, CoreOptions};
use settings::Settings;
use wisp_plugin_runtime::WasmCompiler;

/// Object-store repositories, mirrored locally before anything loads (none without the
/// `object-store` feature).
#[derive(Clone, Default)]
pub(crate) struct Remotes {
    #[cfg(feature = "object-store")]
    repos: Vec<Arc<remote::RemoteRepo>>,
}

impl Remotes {
    /// The mirrors as the service's repository sources: an explicit load syncs its model, and
    /// poll mode syncs them all before each poll.
    fn sources(&self) -> Vec<Arc<dyn service::RepositorySource>> {
        #[cfg(feature = "object-store")]
        return self
            .repos
            .iter()
            .map(|r| r.clone() as Arc<dyn service::RepositorySource>)
            .collect();
        #[cfg(not(feature = "object-store"))]
        Vec::new()
    }
}

/// The repository roots the registry serves: local directories as given, and for each
/// object-store URL its local mirror, synced once here. A URL that cannot be listed (wrong
/// credentials, no such bucket) fails start-up with the bucket named.
async fn mirror_remote_repositories(
    settings: &Settings,
) -> anyhow::Result<(Vec<std::path::PathBuf>, Remotes)> {
    let mut roots = Vec::new();
    #[cfg_attr(
        not(feature = "object-store"),
        expect(unused_mut, reason = "only object-store repositories are added")
    )]
    let mut remotes = Remotes::default();
    for repo in &settings.model_repositories {
        #[cfg(feature = "object-store")]
        if Settings::is_remote_repository(repo) {
            let r = remote::RemoteRepo::new(&repo.to_string_lossy(), &settings.repository_cache())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            r.sync().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            roots.push(r.local().to_path_buf());
            remotes.repos.push(Arc::new(r));
            continue;
        }
        #[cfg(not(feature = "object-store"))]
        if Settings::is_remote_repository(repo) {
            anyhow::bail!(
                "model repository '{}': this build has no object-store support (the edge build leaves it out)",
                repo.display()
            );
        }
        roots.push(repo.clone());
    }
    Ok((roots, remotes))
}

/// The core's options from `wisp serve`'s settings (checked into `resolved`), and the
/// Prometheus metrics when they are on. Mirrors the object-store repositories first.
async fn core_options(
    settings: &Settings,
    resolved: &mut Resolved,
) -> anyhow::Result<(CoreOptions, Option<Arc<metrics::Metrics>>)> {
    let plugin_failures = Arc::new(wisp_plugin_runtime::FailureCounts::default());
    let verify_failures = Arc::new(signing::VerifyFailures::default());
    let verification = resolved.verify_key.take().map(|key| signing::Verification {
        key,
        required: settings.require_signed_models,
        failures: verify_failures.clone(),
    });
    let metrics = match resolved.metrics.take() {
        Some(o) => Some(
            metrics::Metrics::new(o, plugin_failures.clone(), verify_failures)
                .map_err(|e| anyhow::anyhow!(e))?,
        ),
        None => None,
    };
    let trace = std::mem::take(&mut resolved.trace);
    let trace_export = match trace.settings.otel() {
        true => Some(Arc::new(
            service::otel::Exporter::start(&trace.otel, tokio::runtime::Handle::current())
                .map_err(anyhow::Error::msg)?,
        ) as Arc<dyn service::trace::TraceExport>),
        false => None,
    };
    let (repositories, remotes) = mirror_remote_repositories(settings).await?;
    let wasm_compiler_why = match resolved.wasm_compiler {
        WasmCompiler::Pulley if settings.wasm_compiler == settings::WasmCompilerChoice::Auto => {
            ": Pulley, wasmtime's interpreter, the default on riscv64 (Cranelift's riscv64 backend cannot compile every plugin); --wasm-compiler native overrides"
        }
        WasmCompiler::Pulley => ": Pulley, wasmtime's interpreter (slower than native code)",
        WasmCompiler::Native => "",
    };
    let control = |r: &restricted::Restrictions| {
        settings.allow_unauthenticated_control || r.restricts(restricted::ApiGroup::ModelRepository)
    };
    let options = CoreOptions {
        repositories,
        sources: remotes.sources(),
        control_mode: settings.model_control_mode,
        load_model: settings.load_model.clone(),
        poll_every: std::time::Duration::from_secs(settings.repository_poll_secs),
        exit_on_error: settings.exit_on_error,
        strict_readiness: settings.strict_readiness,
        onnx_engine: settings.onnx_engine.into(),
        onnxruntime_lib: settings.onnxruntime_lib.clone(),
        wasm_compiler: resolved.wasm_compiler,
        wasm_compiler_why,
        wasm_cache: settings.wasm_cache(),
        wasm_pooling: settings.wasm_pooling,
        env: settings.env.clone(),
        autocomplete: !settings.disable_auto_complete_config,
        load_threads: settings.model_load_thread_count,
        host_policies: std::mem::take(&mut resolved.host_policies),
        verification,
        state_dir: settings.state_dir.clone(),
        rate_limiter: resolved.rate_limiter.clone(),
        cache_size: resolved.cache_size,
        network_control: service::control::NetworkControl {
            http: control(&resolved.http_restricted),
            grpc: control(&resolved.grpc_restricted),
        },
        max_inflight_bytes: settings.max_inflight_bytes.unwrap_or_else(|| {
            service::core::default_max_inflight_bytes(wisp_core::meminfo::memory_limit())
        }),
        shm_key_prefix: settings.shm_key_prefix.clone(),
        shm_max_bytes: settings.shm_max_bytes,
        allow_client_shm: settings.allow_client_shm,
        shm_require_token: settings.shm_require_token,
        trace,
        trace_export,
        log: logging::LogSettings {
            log_file: settings
                .log_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            log_info: settings.log_info,
            log_warning: settings.log_warning,
            log_error: settings.log_error,
            log_verbose_level: settings.log_verbose as u64,
            log_format: settings.log_format.clone(),
        },
        observers: metrics.clone().map(|m| m as Arc<dyn models::Observers>),
        plugin_failures,
    };
    Ok((options, metrics))
}

/// Checks `settings` (reporting every error at once) and opens the core they describe.
async fn open_core(
    settings: &Settings,
) -> anyhow::Result<(Core, Resolved, Option<Arc<metrics::Metrics>>)> {
    let mut resolved = Resolved::from(settings)?;
    let (options, metrics) = core_options(settings, &mut resolved).await?;
    let core = Core::open(options)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    Ok((core, resolved, metrics))
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    metrics_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    exit_timeout: std::time::Duration,
    core: Option<Core>,
    shutdown: Option<tokio::sync::watch::Sender<bool>>,
    grpc_addr: Option<SocketAddr>,
    grpc_task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Loads the models and starts serving HTTP. Must be called inside a tokio runtime.
    pub async fn start(settings: Settings) -> anyhow::Result<Server> {
        // Every setting is checked before any model loads, and every error is reported.
        let (core, resolved, metrics) = open_core(&settings).await?;
        let (registry, service) = (core.registry().clone(), core.service().clone());
        let state = Arc::new(http::AppState {
            service: service.clone(),
            restricted: resolved.http_restricted,
            max_input_size: settings.http_max_input_size,
            body_timeout: std::time::Duration::from_secs(settings.http_body_timeout_secs),
        });
        let addr = SocketAddr::new(settings.http_address, settings.http_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot bind HTTP on {addr}"))?;
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "HTTP front end listening");
        let (tx, rx) = tokio::sync::watch::channel(false);
        let (http_tls, grpc_tls) = (resolved.http_tls, resolved.grpc_tls);
        let limits = conn::ConnLimits {
            header_timeout: std::time::Duration::from_secs(settings.http_header_timeout_secs),
            idle_timeout: std::time::Duration::from_secs(settings.idle_timeout_secs),
            max_concurrent_streams: settings.grpc_max_concurrent_streams,
            max_header_size: settings.max_header_size as usize,
            min_data_rate: settings.min_data_rate,
            tls_handshake_timeout: std::time::Duration::from_secs(
                settings.tls_handshake_timeout_secs,
            ),
            stream_write_timeout: std::time::Duration::from_secs(
                settings.stream_write_timeout_secs,
            ),
            max_decoupled_per_connection: settings.max_decoupled_per_connection as usize,
        };
        let gate = conn::Gate::new(
            "http+grpc",
            settings
                .max_connections
                .unwrap_or_else(conn::default_max_connections),
            settings
                .max_connections_per_ip
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            settings.min_data_rate,
        );
        tracing::info!(
            max_connections = gate.max(),
            header_timeout_secs = settings.http_header_timeout_secs,
            idle_timeout_secs = settings.idle_timeout_secs,
            "connection limits"
        );
        let (metrics_addr, metrics_task) = match metrics {
            Some(m) => {
                let maddr = SocketAddr::new(
                    settings.metrics_address.unwrap_or(settings.http_address),
                    settings.metrics_port,
                );
                let l = tokio::net::TcpListener::bind(maddr)
                    .await
                    .with_context(|| format!("cannot bind metrics on {maddr}"))?;
                let maddr = l.local_addr()?;
                tracing::info!(addr = %maddr, "metrics endpoint listening");
                let app = metrics::metrics_router(m, registry.clone());
                let (limits, rx) = (limits.clone(), rx.clone());
                (
                    Some(maddr),
                    Some(tokio::spawn(async move {
                        let gate = conn::Gate::new("metrics", 64, None, limits.min_data_rate);
                        conn::serve(l, app, limits, gate, None, rx).await
                    })),
                )
            }
            None => (None, None),
        };
        let (grpc_addr, grpc_task) = if settings.allow_grpc {
            let gaddr = SocketAddr::new(
                settings.grpc_address.unwrap_or(settings.http_address),
                settings.grpc_port,
            );
            let l = tokio::net::TcpListener::bind(gaddr)
                .await
                .with_context(|| format!("cannot bind gRPC on {gaddr}"))?;
            let gaddr = l.local_addr()?;
            tracing::info!(addr = %gaddr, "gRPC front end listening");
            let n = settings.grpc_max_message_size;
            let svc = grpc::GrpcInferenceServiceServer::new(
                grpc::GrpcService::new(
                    service.clone(),
                    settings.grpc_stream_max_in_flight as usize,
                )
                .with_stream_write_timeout(std::time::Duration::from_secs(
                    settings.stream_write_timeout_secs,
                )),
            )
            .max_decoding_message_size(n)
            .max_encoding_message_size(n);
            let (health, health_svc) = tonic_health::server::health_reporter();
            health
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
            health
                .set_service_status(
                    "inference.GRPCInferenceService",
                    tonic_health::ServingStatus::Serving,
                )
                .await;
            let router = tonic::service::Routes::new(svc)
                .add_service(health_svc)
                .into_axum_router()
                .layer(axum::middleware::from_fn_with_state(
                    Arc::new(grpc::GuardState {
                        restricted: resolved.grpc_restricted,
                        budget: service.budget().clone(),
                        service: service.clone(),
                    }),
                    grpc::guard,
                ));
            let (limits, gate, rx) = (limits.clone(), gate.clone(), rx.clone());
            let task = tokio::spawn(conn::serve(l, router, limits, gate, grpc_tls, rx));
            (Some(gaddr), Some(task))
        } else {
            (None, None)
        };
        let app = http::router(state);
        let task = tokio::spawn(conn::serve(
            listener,
            app,
            limits,
            gate,
            http_tls,
            rx.clone(),
        ));
        Ok(Server {
            addr,
            metrics_addr,
            metrics_task,
            exit_timeout: std::time::Duration::from_secs(settings.exit_timeout_secs),
            core: Some(core),
            shutdown: Some(tx),
            grpc_addr,
            grpc_task,
            task,
        })
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound gRPC address, if gRPC is on.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The bound metrics address, if metrics are on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The model registry.
    pub fn registry(&self) -> &Arc<Registry> {
        self.core().registry()
    }

    /// The service the front ends call.
    pub fn service(&self) -> &Arc<service::Service> {
        self.core().service()
    }

    fn core(&self) -> &Core {
        self.core.as_ref().expect("the core lives until shutdown")
    }

    /// Stops accepting connections, waits for in-flight requests, then drains the models, all
    /// within `--exit-timeout-secs`: what is still running then is left behind (the process
    /// exits without it).
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + self.exit_timeout;
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.grpc_task.take() {
            match tokio::time::timeout_at(deadline, t).await {
                Ok(r) => r.context("gRPC task panicked")??,
                Err(_) => tracing::warn!("exit timeout reached with gRPC requests in flight"),
            }
        }
        match tokio::time::timeout_at(deadline, &mut self.task).await {
            Ok(r) => r.context("HTTP task panicked")??,
            Err(_) => {
                tracing::warn!(
                    secs = self.exit_timeout.as_secs(),
                    "exit timeout reached with requests in flight; exiting"
                );
                self.task.abort();
            }
        }
        if let Some(t) = self.metrics_task.take() {
            t.abort();
        }
        let Some(core) = self.core.take() else {
            return Ok(());
        };
        match tokio::time::timeout_at(deadline, core.close()).await {
            Ok(r) => r.map_err(|e| anyhow::anyhow!("{}", e.message())),
            Err(_) => {
                tracing::warn!(
                    secs = self.exit_timeout.as_secs(),
                    "exit timeout reached while models drained; exiting without them"
                );
                Ok(())
            }
        }
    }
}
