//! `wisp-server`: the `wisp` binary's library — settings, model lifecycle, the HTTP front end.
//!
//! [`Server::start`] loads every model of the repositories (off the async runtime), binds the
//! HTTP listener and serves until [`Server::shutdown`] (or SIGINT/SIGTERM in `main`), which
//! stops accepting, lets in-flight requests finish, then drains and stops every model's
//! scheduler.

pub mod http;
pub mod registry;
pub mod settings;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use wisp_backend_onnx::{find_onnxruntime, EngineChoice, OnnxBackend};

use registry::{LoadOptions, Registry};
use settings::{OnnxEngine, Settings};

/// A running server.
pub struct Server {
    addr: SocketAddr,
    registry: Arc<Registry>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Loads the models and starts serving HTTP. Must be called inside a tokio runtime.
    pub async fn start(settings: Settings) -> anyhow::Result<Server> {
        let lib = match settings.onnx_engine {
            OnnxEngine::Tract => None,
            _ => find_onnxruntime(
                settings.onnxruntime_lib.as_deref(),
                &wisp_backend_onnx::ProcessEnv,
            ),
        };
        let choice = match settings.onnx_engine {
            OnnxEngine::Auto => EngineChoice::Auto,
            OnnxEngine::Onnxruntime => EngineChoice::OnnxRuntime,
            OnnxEngine::Tract => EngineChoice::Tract,
        };
        let backend = OnnxBackend::new(choice, lib).map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(engine = backend.engine(), "ONNX engine selected");
        let opts = LoadOptions {
            autocomplete: !settings.disable_auto_complete_config,
            threads: settings.model_load_thread_count,
        };
        let roots = settings.model_repositories.clone();
        let registry = tokio::task::spawn_blocking(move || Registry::load(&roots, &backend, &opts))
            .await
            .context("model loading panicked")?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let registry = Arc::new(registry);
        for (name, entry) in registry.models() {
            if !entry.is_ready() {
                tracing::error!(model = %name, reason = %entry.reason(), "model UNAVAILABLE");
            }
        }
        if settings.exit_on_error && !registry.all_ready() {
            anyhow::bail!("some models failed to load and --exit-on-error is set");
        }
        let state = Arc::new(http::AppState {
            registry: registry.clone(),
            max_input_size: settings.http_max_input_size,
            strict_readiness: settings.strict_readiness,
        });
        let addr = SocketAddr::new(settings.http_address, settings.http_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot bind HTTP on {addr}"))?;
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "HTTP front end listening");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = http::router(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
        });
        Ok(Server {
            addr,
            registry,
            shutdown: Some(tx),
            task,
        })
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Stops accepting connections, waits for in-flight requests, then drains the models.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.context("HTTP task panicked")??;
        let registry = self.registry.clone();
        tokio::task::spawn_blocking(move || registry.shutdown()).await?;
        Ok(())
    }
}
