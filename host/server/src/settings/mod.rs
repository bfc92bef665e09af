//! Process settings: the `wisp serve` flags, named as Triton's where Triton has one, so existing
//! launch commands carry over. Defaults are named constants.

#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use wisp_core::env::{EnvSource, ProcessEnv};

/// Default HTTP port (Triton's).
pub const DEFAULT_HTTP_PORT: u16 = 8000;
/// Default maximum HTTP request body, after decompression (Triton's 64 MB).
pub const DEFAULT_HTTP_MAX_INPUT_SIZE: usize = 64 * 1024 * 1024;

pub use wisp_service::core::{
    default_max_inflight_bytes, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MODEL_LOAD_THREADS,
};

/// Default `--shm-key-prefix`: shm keys must start `/wisp`.
pub const DEFAULT_SHM_KEY_PREFIX: &str = "wisp";

/// Default `--shm-max-bytes`: 1 GiB of registered system shared memory.
pub const DEFAULT_SHM_MAX_BYTES: u64 = wisp_service::shm::DEFAULT_MAX_BYTES;
/// Default gRPC port (Triton's).
pub const DEFAULT_GRPC_PORT: u16 = 8001;
/// Default largest gRPC message, both directions.
pub const DEFAULT_GRPC_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;
/// Default metrics port (Triton's).
pub const DEFAULT_METRICS_PORT: u16 = 8002;

/// `wisp`: a KServe v2 / Triton-compatible inference server with WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "wisp", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start-up; boxing would only complicate every match"
)]
pub enum Command {
    /// Serve the models of one or more model repositories.
    Serve(Settings),
    /// Write the signed manifest (`<version>/MANIFEST` and `MANIFEST.sig`) of a model's versions.
    Sign(SignArgs),
    /// Make an ed25519 key pair for signing models: `<out>.key` (secret) and `<out>.pub`.
    Keygen(KeygenArgs),
    /// Scaffold, build, check and run wasm plugins without a server.
    #[command(subcommand)]
    Plugin(crate::plugin_cli::PluginCommand),
    /// Write an INT8 version of an ONNX model: each format ONNX Runtime's quantizer makes,
    /// calibrated on request bodies, judged by the model's gate against the float version on
    /// held-out ones; the best that passes is written.
    Quantize(QuantizeArgs),
}

/// `wisp quantize`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuantizeArgs {
    /// The model directory (`<repository>/<model>`) of an ONNX model.
    #[arg(value_name = "MODEL_DIR")]
    pub model_dir: PathBuf,
    /// A directory of KServe v2 JSON request bodies (`*.json`) for the model: four in five
    /// calibrate, every fifth is held out for the gate.
    #[arg(long, value_name = "DIR")]
    pub calibration: PathBuf,
    /// The float version to quantize (default: the highest).
    #[arg(long = "from", value_name = "N")]
    pub from: Option<u64>,
    /// The version to write (default: one above the highest); it must not exist.
    #[arg(long, value_name = "N")]
    pub version: Option<u64>,
    /// A Python with the `onnxruntime` package (default: WISP_PYTHON, else `python3`).
    #[arg(long, value_name = "FILE")]
    pub python: Option<PathBuf>,
    /// The engine the candidates are judged on (as `wisp serve` would run them).
    #[arg(long, value_enum, default_value_t = OnnxEngine::Auto)]
    pub onnx_engine: OnnxEngine,
    /// ONNX Runtime shared library (else ORT_DYLIB_PATH, else the Python package's).
    #[arg(long, value_name = "FILE")]
    pub onnxruntime_lib: Option<PathBuf>,
}

/// `wisp sign`.
#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// The model directory (`<repository>/<model>`).
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    /// The secret key file (from `wisp keygen`).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// Versions to sign; every version directory when none is given.
    #[arg(long = "version", value_name = "N")]
    pub versions: Vec<u64>,
}

/// `wisp keygen`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeygenArgs {
    /// Path prefix of the two key files.
    #[arg(long, value_name = "PREFIX")]
    pub out: PathBuf,
}

/// Which engine runs ONNX models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnnxEngine {
    /// ONNX Runtime when its library is found, else tract.
    Auto,
    /// ONNX Runtime only.
    Onnxruntime,
    /// The embedded pure-Rust tract engine only.
    Tract,
}

impl From<OnnxEngine> for wisp_backend_onnx::EngineChoice {
    fn from(e: OnnxEngine) -> Self {
        match e {
            OnnxEngine::Auto => Self::Auto,
            OnnxEngine::Onnxruntime => Self::OnnxRuntime,
            OnnxEngine::Tract => Self::Tract,
        }
    }
}

/// What compiles wasm plugins (`--wasm-compiler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WasmCompilerChoice {
    /// Pulley on riscv64 (Cranelift's riscv64 backend cannot compile every plugin there),
    /// native code elsewhere.
    Auto,
    /// Cranelift's machine code for this CPU.
    Native,
    /// Pulley, wasmtime's portable interpreter: slower, but asks nothing of the CPU.
    Pulley,
}

pub use wisp_service::ControlMode;

/// Everything `wisp serve` is configured with.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// Model repository directory; repeat for several (a name found in two is unavailable).
    #[arg(
        long = "model-repository",
        alias = "model-store",
        required = true,
        value_name = "DIR"
    )]
    pub model_repositories: Vec<PathBuf>,

    /// How models are loaded and changed at run time.
    #[arg(long, value_enum, default_value_t = ControlMode::None)]
    pub model_control_mode: ControlMode,

    /// Seconds between repository polls (poll mode).
    #[arg(long, default_value_t = 15)]
    pub repository_poll_secs: u64,

    /// In explicit mode, let anyone who reaches the HTTP or gRPC port load and unload models
    /// (which runs their files and config overrides). Without it, network control is refused
    /// unless `--http-restricted-api` / `--grpc-restricted-protocol` puts `model-repository`
    /// behind a key.
    #[arg(long, default_value_t = false)]
    pub allow_unauthenticated_control: bool,

    /// Model to load at start-up in explicit mode; repeat for several, `*` for all.
    #[arg(long, value_name = "NAME")]
    pub load_model: Vec<String>,

    /// Seconds to wait for in-flight requests at shutdown before exiting anyway.
    #[arg(long, default_value_t = 30)]
    pub exit_timeout_secs: u64,

    /// Under a systemd watchdog (`WatchdogSec=`): seconds one model instance may spend in one
    /// execution before Wisp counts it as stuck and stops pinging the watchdog, so that systemd
    /// restarts it (1 to 86400).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub instance_stall_secs: u64,

    /// HTTP port; 0 picks a free port.
    #[arg(long, default_value_t = DEFAULT_HTTP_PORT)]
    pub http_port: u16,

    /// Address the HTTP front end binds.
    #[arg(long, default_value = "0.0.0.0")]
    pub http_address: IpAddr,

    /// Largest accepted HTTP request body in bytes (also caps decompressed bodies).
    #[arg(long, default_value_t = DEFAULT_HTTP_MAX_INPUT_SIZE)]
    pub http_max_input_size: usize,

    /// Seconds a client has to send a request's headers, counted from when the server starts
    /// waiting for them (so also the longest a keep-alive HTTP/1 connection may wait between
    /// requests).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_header_timeout_secs: u64,

    /// Seconds a client has to send a whole request body.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_body_timeout_secs: u64,

    /// Close a connection (HTTP, gRPC or metrics) after this many seconds with no bytes moving
    /// and no request in flight.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub idle_timeout_secs: u64,

    /// Seconds a client may leave a response untaken (a gRPC stream's next message, a
    /// `generate_stream` event, any body) before its connection is closed and its requests
    /// cancelled; HTTP/2 PING frames do not extend it.
    #[arg(long, alias = "stream-write-timeout", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub stream_write_timeout_secs: u64,

    /// Decoupled (streaming) requests one connection may have in flight at once, across all
    /// of its streams (gRPC `ModelStreamInfer`, HTTP `generate_stream`); past it a request is
    /// refused with RESOURCE_EXHAUSTED / 503.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_decoupled_per_connection: u32,

    /// Most HTTP and gRPC connections open at once (default: three quarters of the open-file
    /// limit); more are closed as they arrive. The metrics endpoint has its own 64.
    #[arg(long)]
    pub max_connections: Option<usize>,

    /// Most HTTP and gRPC connections open at once from one IP address (default: no cap below
    /// `--max-connections`); over it, that address's idlest or slowest connection is closed
    /// for the new one, or the new one is.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1048576))]
    pub max_connections_per_ip: Option<u64>,

    /// The slowest a request body may arrive, in bytes per second on average, once 5 s have
    /// passed (gRPC streams excepted); also the rate below which an unanswered connection
    /// counts as slow, to be closed for a new one at the connection cap. 0 turns both off.
    #[arg(long, default_value_t = 240, value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    pub min_data_rate: u64,

    /// Seconds a TLS handshake may take.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub tls_handshake_timeout_secs: u64,

    /// Largest request header block in bytes: HTTP/2 header lists; an HTTP/1 head is capped at
    /// the larger of this and 400 KiB (hyper's read buffer, which also sizes body reads).
    #[arg(long, default_value_t = 32 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1048576))]
    pub max_header_size: u64,

    /// Concurrent HTTP/2 streams (gRPC calls) per connection.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub grpc_max_concurrent_streams: u32,

    /// Memory that requests being decoded may take at once, in bytes (charged as each body
    /// arrives and inflates, then estimated for its decoded tensors); past it, inference
    /// requests get 503 / RESOURCE_EXHAUSTED until others finish. Default: 2 GiB, or half the
    /// cgroup's `memory.max` (systemd's `MemoryMax`), or without one half the host's memory,
    /// when that is less.
    #[arg(long)]
    pub max_inflight_bytes: Option<u64>,

    /// The prefix every system shared memory key must start with after its `/` (Triton
    /// clients name keys as they like; only objects named this way can be registered). An
    /// empty prefix allows any shm object.
    #[arg(long, default_value = DEFAULT_SHM_KEY_PREFIX)]
    pub shm_key_prefix: String,

    /// Refuse shared memory registrations without a `wisp-shm-token` header (gRPC metadata):
    /// then no client can use, list or unregister a region registered under another token.
    /// Without it, clients that send no token share one scope, as in Triton.
    #[arg(long, default_value_t = false)]
    pub shm_require_token: bool,

    /// Bytes of system shared memory one token may have registered at once (clients without a
    /// token share one quota). Regions are read and written through their descriptors, never
    /// mapped, so this bounds what a scope may name, not the server's memory.
    #[arg(long, default_value_t = DEFAULT_SHM_MAX_BYTES)]
    pub shm_max_bytes: u64,

    /// Let clients register system shared memory regions (Triton's flag, off by default as in
    /// Triton since 26.05). When on, any client that can reach the server and create a shm
    /// object on this host can have the server read its inputs from it and write outputs into
    /// it; `--shm-require-token` then keeps each token's regions and keys its own.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_client_shm: bool,

    /// Requests of one gRPC `ModelStreamInfer` stream in flight at once, unread responses
    /// included; past it the stream is not read until the client catches up.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub grpc_stream_max_in_flight: u32,

    /// Verify signed model manifests with this ed25519 public key (from `wisp keygen`) before
    /// loading; a version whose files do not match its signed manifest does not load.
    #[arg(long, value_name = "FILE")]
    pub model_verify_key: Option<PathBuf>,

    /// Load only model versions with a valid signed manifest (needs --model-verify-key); load
    /// requests may not override their config.
    #[arg(long)]
    pub require_signed_models: bool,

    /// Serve gRPC over TLS (Triton's flag).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub grpc_use_ssl: bool,

    /// gRPC server certificate chain, PEM.
    #[arg(long, value_name = "FILE")]
    pub grpc_server_cert: Option<PathBuf>,

    /// gRPC server private key, PEM.
    #[arg(long, value_name = "FILE")]
    pub grpc_server_key: Option<PathBuf>,

    /// Root certificate(s) gRPC client certificates must chain to, PEM (mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub grpc_root_cert: Option<PathBuf>,

    /// Require and verify gRPC client certificates (Triton's flag).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub grpc_use_ssl_mutual: bool,

    /// Serve HTTP over TLS (Wisp-specific; Triton's HTTP has no TLS).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub http_use_ssl: bool,

    /// HTTP server certificate chain, PEM.
    #[arg(long, value_name = "FILE")]
    pub http_server_cert: Option<PathBuf>,

    /// HTTP server private key, PEM.
    #[arg(long, value_name = "FILE")]
    pub http_server_key: Option<PathBuf>,

    /// Root certificate(s) HTTP client certificates must chain to, PEM (mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub http_root_cert: Option<PathBuf>,

    /// Require and verify HTTP client certificates.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub http_use_ssl_mutual: bool,

    /// Gate API groups behind a header, Triton's syntax `<group>[,<group>...]:<header>=<value>`
    /// (groups: health, metadata, inference, shared-memory, model-config, model-repository,
    /// statistics, trace, logging); repeat for several. Refused requests get 403.
    #[arg(long, value_name = "GROUPS:HEADER=VALUE")]
    pub http_restricted_api: Vec<String>,

    /// Gate gRPC API groups behind a header, as `--http-restricted-api`; clients send the header
    /// as `triton-grpc-protocol-<header>`. Refused calls get UNAVAILABLE.
    #[arg(long, value_name = "GROUPS:HEADER=VALUE")]
    pub grpc_restricted_protocol: Vec<String>,

    /// Serve the gRPC front end.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,

    /// gRPC port; 0 picks a free port.
    #[arg(long, default_value_t = DEFAULT_GRPC_PORT)]
    pub grpc_port: u16,

    /// Address the gRPC front end binds (default: --http-address).
    #[arg(long)]
    pub grpc_address: Option<IpAddr>,

    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, default_value_t = DEFAULT_GRPC_MAX_MESSAGE_SIZE)]
    pub grpc_max_message_size: usize,

    /// Serve Prometheus metrics.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,

    /// Metrics port (`GET /metrics`); 0 picks a free port.
    #[arg(long, default_value_t = DEFAULT_METRICS_PORT)]
    pub metrics_port: u16,

    /// Address the metrics endpoint binds (default: --http-address).
    #[arg(long)]
    pub metrics_address: Option<IpAddr>,

    /// Metrics settings `key=value`: summary_latencies, summary_quantiles, counter_latencies.
    #[arg(long, value_name = "KEY=VALUE")]
    pub metrics_config: Vec<String>,

    /// Accepted for compatibility: CPU and memory gauges are sampled at each scrape.
    #[arg(long, default_value_t = 2000)]
    pub metrics_interval_ms: u64,

    /// Named CPU set for instance groups, Triton's syntax `NAME,cpu-cores=a-b`; repeat for several.
    #[arg(long, value_name = "NAME,cpu-cores=a-b")]
    pub host_policy: Vec<String>,

    /// Triton's rate limiter: `off` (the default, as in Triton) or `execution_count`, under
    /// which an instance executes only while the resources its `instance_group.rate_limiter`
    /// names are free.
    #[arg(long, value_name = "off|execution_count", default_value = "off")]
    pub rate_limit: String,

    /// A rate-limiter resource's total, `NAME:COUNT` (or Triton's `NAME:COUNT:DEVICE`, the
    /// device ignored); repeat for several. Unlisted resources total the most any instance
    /// asks for.
    #[arg(long, value_name = "NAME:COUNT")]
    pub rate_limit_resource: Vec<String>,

    /// Response cache, Triton's syntax: `local,size=BYTES`.
    #[arg(long, value_name = "local,size=BYTES")]
    pub cache_config: Vec<String>,

    /// Tracing, Triton's syntax, repeatable: `level=TIMESTAMPS`, `rate=N`, `count=N`,
    /// `log-frequency=N`, `mode=triton`, `triton,file=PATH` (the trace file; only settable here).
    #[arg(long, value_name = "[MODE,]KEY=VALUE")]
    pub trace_config: Vec<String>,

    /// Verbose logging level (0 = off, 1 = debug, 2+ = trace).
    #[arg(long, default_value_t = 0)]
    pub log_verbose: u8,

    /// Log informational messages.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_info: bool,

    /// Log warnings.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_warning: bool,

    /// Log errors.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub log_error: bool,

    /// Log line format: `default` or `ISO8601`.
    #[arg(long, default_value = "default", value_parser = ["default", "ISO8601"])]
    pub log_format: String,

    /// Write logs to this file instead of standard error.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// Exit after loading if any model failed to load (Triton defaults this to true; Wisp keeps
    /// serving the healthy models and reports the broken ones as UNAVAILABLE).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub exit_on_error: bool,

    /// The server is ready only when every model is ready.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,

    /// Do not fill in missing inputs/outputs/max_batch_size from the model file.
    #[arg(long)]
    pub disable_auto_complete_config: bool,

    /// Threads loading models in parallel at start-up.
    #[arg(long, default_value_t = DEFAULT_MODEL_LOAD_THREADS)]
    pub model_load_thread_count: usize,

    /// ONNX Runtime shared library (else ORT_DYLIB_PATH, else an installed `onnxruntime` Python
    /// package; if none is found, tract serves ONNX models).
    #[arg(long, value_name = "FILE")]
    pub onnxruntime_lib: Option<PathBuf>,

    /// Which engine serves ONNX models.
    #[arg(long, value_enum, default_value_t = OnnxEngine::Auto)]
    pub onnx_engine: OnnxEngine,

    /// Where compiled wasm plugins are cached, keyed by wasmtime version, engine settings and
    /// the component's sha256 (default: $XDG_CACHE_HOME/wisp/wasm or ~/.cache/wisp/wasm).
    #[arg(long, value_name = "DIR")]
    pub wasm_cache_dir: Option<PathBuf>,

    /// Compile plugins on every load instead of caching them.
    #[arg(long)]
    pub no_wasm_cache: bool,

    /// Where object-store repositories (`--model-repository s3://…`) are mirrored (default:
    /// $XDG_CACHE_HOME/wisp/repos or ~/.cache/wisp/repos, else the temporary directory).
    #[arg(long, value_name = "DIR")]
    pub repository_cache_dir: Option<PathBuf>,

    /// Where Wisp keeps state across restarts: the versions rolled back for breaching their SLA,
    /// withheld until their files change (without it they are withheld until the server
    /// restarts). The Debian package's unit sets its StateDirectory, /var/lib/wisp-state.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Use wasmtime's pooling instance allocator for plugins (falls back to on-demand
    /// allocation when the address space cannot be reserved).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub wasm_pooling: bool,

    /// What compiles plugins: native machine code, or Pulley, wasmtime's interpreter (auto:
    /// Pulley on riscv64, native elsewhere).
    #[arg(long, value_enum, default_value_t = WasmCompilerChoice::Auto)]
    pub wasm_compiler: WasmCompilerChoice,

    /// Where environment variables are read from (`ORT_DYLIB_PATH`, `WISP_PYTHON`, the cache
    /// directory's, and those `wasm.allow_env` grants): the process environment unless an
    /// embedder or a test sets another.
    #[arg(skip = process_env())]
    pub env: Arc<dyn EnvSource>,
}

fn process_env() -> Arc<dyn EnvSource> {
    Arc::new(ProcessEnv)
}

impl Settings {
    /// The HTTP listener's TLS files (`--http-server-cert` …), whether or not TLS is on.
    pub fn http_tls_files(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.http_server_cert.clone(),
            key: self.http_server_key.clone(),
            root: self.http_root_cert.clone(),
            mutual: self.http_use_ssl_mutual,
        }
    }

    /// The gRPC listener's TLS files (`--grpc-server-cert` …), whether or not TLS is on.
    pub fn grpc_tls_files(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.grpc_server_cert.clone(),
            key: self.grpc_server_key.clone(),
            root: self.grpc_root_cert.clone(),
            mutual: self.grpc_use_ssl_mutual,
        }
    }

    /// The plugin cache directory in effect (`None`: caching is off).
    pub fn wasm_cache(&self) -> Option<PathBuf> {
        if self.no_wasm_cache {
            return None;
        }
        if let Some(d) = &self.wasm_cache_dir {
            return Some(d.clone());
        }
        Some(self.user_cache()?.join("wisp").join("wasm"))
    }

    /// Whether `repo` (a `--model-repository` value) names an object-store repository rather
    /// than a directory.
    pub fn is_remote_repository(repo: &std::path::Path) -> bool {
        let s = repo.to_string_lossy();
        ["s3://", "gs://", "as://", "az://"]
            .iter()
            .any(|scheme| s.starts_with(scheme))
    }

    /// The directory object-store repositories are mirrored into.
    pub fn repository_cache(&self) -> PathBuf {
        if let Some(d) = &self.repository_cache_dir {
            return d.clone();
        }
        self.user_cache()
            .unwrap_or_else(std::env::temp_dir)
            .join("wisp")
            .join("repos")
    }

    /// `$XDG_CACHE_HOME`, else `~/.cache`.
    fn user_cache(&self) -> Option<PathBuf> {
        wisp_service::core::user_cache_dir(&*self.env)
    }

    /// Settings for a repository with every other value at its default (used by tests and
    /// embedders).
    pub fn for_repository(repo: impl Into<PathBuf>) -> Self {
        let cli = Cli::parse_from(["wisp", "serve", "--model-repository", "."]);
        let Command::Serve(mut s) = cli.command else {
            unreachable!("parsed as serve")
        };
        s.model_repositories = vec![repo.into()];
        s
    }
}
