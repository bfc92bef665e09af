//! What every way of running Wisp shares: the engines, the models, the [`Service`] over them,
//! and the tasks that keep the repository current. `wisp-server` puts its front ends on a
//! [`Core`]; [`crate::embed::Embedded`] (and through it the Python binding) calls it
//! in-process.
//!
//! A [`Core`] is opened from [`CoreOptions`]: plain values, already parsed and checked, so
//! the server's command line (and its TLS, ports and metrics exporter) stays in `wisp-server`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wisp_backend_onnx::{find_onnxruntime, EngineChoice, OnnxBackend};
use wisp_core::backend::{Backend, LoadedModel};
use wisp_core::config::{ModelIo, ModelSpec};
use wisp_core::env::{EnvSource, ProcessEnv};
use wisp_core::{Error, Result};
use wisp_plugin_runtime::{FailureCounts, WasmBackend, WasmCompiler, WasmOptions};
use wisp_scheduler::rate_limit::RateLimiter;

use crate::cache::ResponseCache;
use crate::control::NetworkControl;
use crate::logging::{LogControl, LogSettings};
use crate::models::host_policy::HostPolicies;
use crate::models::signing::Verification;
use crate::models::{LoadOptions, Observers, Registry};
use crate::trace::{TraceConfig, TraceControl, TraceExport};
use crate::{ControlMode, RepositorySource, Service};

/// The in-flight budget without a cgroup limit (2 GiB).
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 2 << 30;

/// Default `--model-load-thread-count` (Triton's).
pub const DEFAULT_MODEL_LOAD_THREADS: usize = 4;

/// The default in-flight budget: 2 GiB, or half of `memory` (the memory the server may use:
/// [`wisp_core::meminfo::memory_limit`]) when that is less, and at least 16 MiB.
pub fn default_max_inflight_bytes(memory: Option<u64>) -> u64 {
    memory.map_or(DEFAULT_MAX_INFLIGHT_BYTES, |max| {
        (max / 2).clamp(16 << 20, DEFAULT_MAX_INFLIGHT_BYTES)
    })
}

/// `$XDG_CACHE_HOME`, else `~/.cache`, from `env`.
pub fn user_cache_dir(env: &dyn EnvSource) -> Option<PathBuf> {
    env.var("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|h| PathBuf::from(h).join(".cache")))
}

/// Everything a [`Core`] is made from. [`CoreOptions::for_repositories`] gives `wisp serve`'s
/// defaults; the server fills the rest from its flags.
pub struct CoreOptions {
    /// Local repository directories (an object-store repository: its mirror).
    pub repositories: Vec<PathBuf>,
    /// The object-store repositories behind some of those directories: an explicit load syncs
    /// its model first, and poll mode syncs them all before each poll.
    pub sources: Vec<Arc<dyn RepositorySource>>,
    /// How models are loaded and changed at run time.
    pub control_mode: ControlMode,
    /// The models explicit mode loads at start-up.
    pub load_model: Vec<String>,
    /// How often poll mode looks at the repositories.
    pub poll_every: Duration,
    /// Fail [`Core::open`] if any model failed to load.
    pub exit_on_error: bool,
    /// Ready only if every model is ready.
    pub strict_readiness: bool,
    /// Which engine serves ONNX models.
    pub onnx_engine: EngineChoice,
    /// ONNX Runtime's shared library (else it is looked for, see `find_onnxruntime`).
    pub onnxruntime_lib: Option<PathBuf>,
    /// What compiles plugins.
    pub wasm_compiler: WasmCompiler,
    /// Why that compiler, for the start-up log (empty: the usual one).
    pub wasm_compiler_why: &'static str,
    /// Where compiled plugins are cached (`None`: compiled on every load).
    pub wasm_cache: Option<PathBuf>,
    /// wasmtime's pooling instance allocator for plugins.
    pub wasm_pooling: bool,
    /// Where environment variables are read.
    pub env: Arc<dyn EnvSource>,
    /// Fill in missing inputs, outputs and `max_batch_size` from the model file.
    pub autocomplete: bool,
    /// Threads loading models in parallel at start-up.
    pub load_threads: usize,
    /// `--host-policy`.
    pub host_policies: HostPolicies,
    /// Signed-model verification (`--model-verify-key`); `required` also keeps a load request
    /// from replacing a signed config.
    pub verification: Option<Verification>,
    /// Where the versions rolled back for breaching their SLA are remembered.
    pub state_dir: Option<PathBuf>,
    /// Triton's rate limiter, when it is on.
    pub rate_limiter: Option<Arc<RateLimiter>>,
    /// The response cache's size in bytes, when it is on.
    pub cache_size: Option<usize>,
    /// Which network front ends may load and unload in explicit mode.
    pub network_control: NetworkControl,
    /// The in-flight request memory budget.
    pub max_inflight_bytes: u64,
    /// The prefix every system shared memory key must start with after its `/`.
    pub shm_key_prefix: String,
    /// Bytes of system shared memory one scope (token) may have registered at once.
    pub shm_max_bytes: u64,
    /// Whether clients may register system shared memory at all (`--allow-client-shm`).
    pub allow_client_shm: bool,
    /// Refuse shared memory registrations without a token.
    pub shm_require_token: bool,
    /// The trace settings.
    pub trace: TraceConfig,
    /// Where traces go in `opentelemetry` mode (the server's OTLP exporter).
    pub trace_export: Option<Arc<dyn TraceExport>>,
    /// The logging settings reported (and changed) by the logging extension.
    pub log: LogSettings,
    /// Told of every load, unload and failure (the server's Prometheus metrics).
    pub observers: Option<Arc<dyn Observers>>,
    /// Where plugin traps, timeouts and memory kills are counted.
    pub plugin_failures: Arc<FailureCounts>,
}

impl CoreOptions {
    /// `repositories` served with every other option at `wisp serve`'s default.
    pub fn for_repositories(repositories: Vec<PathBuf>) -> Self {
        let env: Arc<dyn EnvSource> = Arc::new(ProcessEnv);
        CoreOptions {
            repositories,
            sources: Vec::new(),
            control_mode: ControlMode::None,
            load_model: Vec::new(),
            poll_every: Duration::from_secs(15),
            exit_on_error: false,
            strict_readiness: true,
            onnx_engine: EngineChoice::Auto,
            onnxruntime_lib: None,
            wasm_compiler: WasmCompiler::host_default(),
            wasm_compiler_why: "",
            wasm_cache: user_cache_dir(&*env).map(|d| d.join("wisp").join("wasm")),
            wasm_pooling: true,
            env,
            autocomplete: true,
            load_threads: DEFAULT_MODEL_LOAD_THREADS,
            host_policies: HostPolicies::default(),
            verification: None,
            state_dir: None,
            rate_limiter: None,
            cache_size: None,
            network_control: NetworkControl::default(),
            max_inflight_bytes: default_max_inflight_bytes(wisp_core::meminfo::memory_limit()),
            shm_key_prefix: "wisp".into(),
            shm_max_bytes: crate::shm::DEFAULT_MAX_BYTES,
            allow_client_shm: false,
            shm_require_token: false,
            trace: TraceConfig::default(),
            trace_export: None,
            log: LogSettings::default(),
            observers: None,
            plugin_failures: Arc::default(),
        }
    }
}

/// The one [`Backend`]: `backend: "wasm"` models go to wasmtime, `platform: "ensemble"` to
/// the ensemble DAG, the rest to ONNX Runtime or tract.
struct Backends {
    onnx: OnnxBackend,
    wasm: WasmBackend,
    ensemble: crate::models::ensemble::EnsembleBackend,
}

impl Backend for Backends {
    fn describe(&self, model_file: &Path) -> Result<ModelIo> {
        if model_file.extension().is_some_and(|e| e == "wasm") {
            self.wasm.describe(model_file)
        } else {
            self.onnx.describe(model_file)
        }
    }

    fn load(&self, spec: &ModelSpec, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        if spec.config.is_wasm() {
            self.wasm.load(spec, model_file)
        } else if spec.config.is_ensemble() {
            self.ensemble.load(spec, model_file)
        } else {
            self.onnx.load(spec, model_file)
        }
    }
}

/// The models, the service over them, and the tasks that keep the repository current.
pub struct Core {
    registry: Arc<Registry>,
    service: Arc<Service>,
    poller: Option<tokio::task::JoinHandle<()>>,
    /// Judges reloads under SLA watch (`Registry::watch_rollouts`).
    rollouts: tokio::task::JoinHandle<()>,
}

impl Core {
    /// Chooses the engines, loads the models (off the async runtime) and builds the service.
    /// Must be called inside a tokio runtime.
    pub async fn open(o: CoreOptions) -> Result<Core> {
        let lib = match o.onnx_engine {
            EngineChoice::Tract => None,
            // An edge build has no ONNX Runtime to look for.
            EngineChoice::Auto if !OnnxBackend::HAS_ONNXRUNTIME => None,
            _ => find_onnxruntime(o.onnxruntime_lib.as_deref(), &*o.env),
        };
        let backend = OnnxBackend::new(o.onnx_engine, lib)?;
        let edge = if OnnxBackend::HAS_ONNXRUNTIME {
            ""
        } else {
            ": this build has no ONNX Runtime (edge build), tract serves every ONNX model"
        };
        tracing::info!(engine = backend.engine(), "ONNX engine selected{edge}");
        tracing::info!(
            compiler = o.wasm_compiler.as_str(),
            "plugin compiler selected{}",
            o.wasm_compiler_why
        );
        let caller = Arc::new(crate::models::caller::RegistryCaller::default());
        let wasm = WasmBackend::new(
            WasmOptions {
                cache_dir: o.wasm_cache,
                pooling: o.wasm_pooling,
                compiler: o.wasm_compiler,
                failures: o.plugin_failures,
                env: o.env,
            },
            Some(caller.clone()),
        );
        let signed_only = o.verification.as_ref().is_some_and(|v| v.required);
        let opts = LoadOptions {
            autocomplete: o.autocomplete,
            threads: o.load_threads,
            observers: o.observers,
            host_policies: o.host_policies,
            verification: o.verification,
            state_dir: o.state_dir,
            rate_limiter: o.rate_limiter,
        };
        let registry = Arc::new(Registry::new(
            o.repositories,
            Arc::new(Backends {
                onnx: backend,
                wasm,
                ensemble: crate::models::ensemble::EnsembleBackend::new(caller.clone()),
            }),
            opts,
        ));
        caller.attach(&registry);
        let initial: Option<Vec<String>> = match o.control_mode {
            ControlMode::Explicit => Some(o.load_model),
            ControlMode::None | ControlMode::Poll => None,
        };
        let r = registry.clone();
        tokio::task::spawn_blocking(move || r.load_initial(initial.as_deref()))
            .await
            .map_err(|e| Error::internal(format!("model loading panicked: {e}")))??;
        for (name, entry) in registry.models() {
            if !entry.is_ready() {
                tracing::error!(model = %name, reason = %entry.reason(), "model UNAVAILABLE");
            }
        }
        if o.exit_on_error && !registry.all_ready() {
            return Err(Error::unavailable(
                "some models failed to load and --exit-on-error is set",
            ));
        }
        tracing::info!(
            bytes = o.max_inflight_bytes,
            "in-flight request memory budget"
        );
        let service = Arc::new(Service {
            registry: registry.clone(),
            cache: o.cache_size.map(|size| Arc::new(ResponseCache::new(size))),
            strict_readiness: o.strict_readiness,
            startup_failures: registry
                .models()
                .into_iter()
                .filter(|(_, e)| !e.is_ready())
                .map(|(name, _)| name)
                .collect(),
            control_mode: o.control_mode,
            network_control: o.network_control,
            signed_only,
            budget: Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(o.max_inflight_bytes / 1024)
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            shm: crate::shm::SharedMemory::new(&o.shm_key_prefix, o.shm_max_bytes)
                .allowing_clients(o.allow_client_shm)
                .requiring_token(o.shm_require_token),
            remotes: o.sources.clone(),
            trace: TraceControl::new(o.trace.settings, o.trace_export),
            logging: LogControl::new(o.log),
        });
        let poller = (o.control_mode == ControlMode::Poll).then(|| {
            let r = registry.clone();
            let sources = o.sources;
            let every = o.poll_every.max(Duration::from_secs(1));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    for source in &sources {
                        source.sync_all().await;
                    }
                    let r = r.clone();
                    let _ = tokio::task::spawn_blocking(move || r.poll()).await;
                }
            })
        });
        // SLA-guarded rollout: reloads under watch are judged a few times a second.
        let rollouts = {
            let r = registry.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if r.watching() {
                        let r = r.clone();
                        let _ = tokio::task::spawn_blocking(move || r.watch_rollouts()).await;
                    }
                }
            })
        };
        Ok(Core {
            registry,
            service,
            poller,
            rollouts,
        })
    }

    /// The model registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The service the front ends call.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Stops the repository poller and the SLA watch.
    pub fn stop_tasks(&self) {
        if let Some(t) = &self.poller {
            t.abort();
        }
        self.rollouts.abort();
    }

    /// Stops the background tasks, then drains every model's scheduler and writes the last
    /// traces. Requests still running finish first (the drain waits for them).
    pub async fn close(self) -> Result<()> {
        self.stop_tasks();
        let registry = self.registry;
        let joined = |e: tokio::task::JoinError| Error::internal(format!("shutdown: {e}"));
        tokio::task::spawn_blocking(move || registry.shutdown())
            .await
            .map_err(joined)?;
        let service = self.service;
        tokio::task::spawn_blocking(move || service.trace.shutdown())
            .await
            .map_err(joined)?;
        Ok(())
    }
}
