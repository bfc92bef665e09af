//! The typed form of a config's `parameters` that Wisp itself reads: a plugin's sandbox
//! (`wasm.*`), the embeddings API mapping (`openai.*`), a rollout's SLA (`sla.*`) and a new
//! version's gate (`gate.*`).
//!
//! [`super::validate`] reads them once, with the rest of the config, and reports a malformed
//! value as a config error naming `parameters.<key>`; the backends and the server then take
//! the typed [`Params`] from the [`super::ModelSpec`] and never parse the strings again.
//! Parameters under other prefixes are the model's own and are passed through untouched.

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{ConfigError, ModelConfig};

mod gate;
mod narrow;
mod onnx;
use crate::datatype::DataType;
pub use gate::{
    Gate, BASELINE_KEY, MAX_ABS_DIFF_KEY, MAX_LATENCY_RATIO_KEY, MIN_COSINE_KEY, MIN_TOP1_KEY,
    ROUNDS_KEY,
};
pub use narrow::check_override_narrows;
pub use onnx::{
    Accelerator, EngineRequest, ExecutionMode, GraphLevel, OnnxOptions, ENGINE_KEY, INTER_OP_KEY,
    INTRA_OP_KEY, MAX_OP_THREADS,
};

/// Per-instance linear-memory cap (`wasm.memory_limit_mb`, default 256).
pub const MEMORY_LIMIT_KEY: &str = "wasm.memory_limit_mb";
/// Per-`execute` deadline in milliseconds (`wasm.timeout_ms`, default 5000).
pub const TIMEOUT_KEY: &str = "wasm.timeout_ms";
/// Fuel (instructions, roughly) per `execute`; 0 or absent = unmetered (`wasm.fuel`).
pub const FUEL_KEY: &str = "wasm.fuel";
/// Comma-separated names of server environment variables the plugin may read (`wasm.allow_env`).
pub const ENV_KEY: &str = "wasm.allow_env";
/// `true` gives the plugin the real wall and monotonic clocks (`wasm.allow_clock`).
pub const CLOCK_KEY: &str = "wasm.allow_clock";
/// A directory, relative to the model directory, mounted read-only at `/data`
/// (`wasm.allow_read_dir`).
pub const READ_DIR_KEY: &str = "wasm.allow_read_dir";
/// `false` keeps the plugin's calls on its instances' own threads (`wasm.on_caller`, default
/// `true`: a short call to an idle instance of a plugin that calls no other model runs on the
/// thread that received the request, with no hand-off).
pub const ON_CALLER_KEY: &str = "wasm.on_caller";
/// Every `wasm.*` key the sandbox knows.
pub const SANDBOX_KEYS: [&str; 7] = [
    MEMORY_LIMIT_KEY,
    TIMEOUT_KEY,
    FUEL_KEY,
    ENV_KEY,
    CLOCK_KEY,
    READ_DIR_KEY,
    ON_CALLER_KEY,
];

/// The largest memory cap a model may ask for (the pooling allocator reserves this much address
/// space per memory slot).
pub const MAX_MEMORY_MB: u64 = 4096;

/// The parameter with the p99 latency bound, in milliseconds.
pub const P99_KEY: &str = "sla.p99_latency_ms";
/// The parameter with the error-rate bound, a fraction.
pub const ERROR_RATE_KEY: &str = "sla.max_error_rate";
/// The parameter with the watch window, in seconds.
pub const WINDOW_KEY: &str = "sla.window_secs";
/// The parameter with the number of requests needed before judging.
pub const MIN_REQUESTS_KEY: &str = "sla.min_requests";

const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
const DEFAULT_MIN_REQUESTS: u64 = 20;

/// The most texts one embeddings request may carry (OpenAI's own limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The parameters of one model that Wisp reads, typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    /// The plugin's sandbox; `Some` exactly for a wasm model.
    pub sandbox: Option<Sandbox>,
    /// ONNX Runtime's settings (Triton's ONNX Runtime backend's), as far as an ONNX model's
    /// config sets them.
    pub onnx: OnnxOptions,
    /// How the model joins the embeddings API, when it does (`openai.api: "embeddings"`);
    /// shared, since every embeddings request reads it.
    pub embeddings: Option<Arc<EmbeddingApi>>,
    /// The SLA a new version is watched against, when the config declares one.
    pub sla: Option<Sla>,
    /// What a new version must keep against the one it replaces before it serves, when the
    /// config declares a gate.
    pub gate: Option<Gate>,
}

/// Reads every group of `cfg`'s parameters, pushing one error per malformed group to `errs`.
/// `wasm` says whether `cfg` is a plugin's (only then are `wasm.*` read).
pub(super) fn read(
    cfg: &ModelConfig,
    model_dir: &Path,
    wasm: bool,
    errs: &mut Vec<ConfigError>,
) -> Params {
    fn ok<T>(r: Result<T, ConfigError>, errs: &mut Vec<ConfigError>) -> Option<T> {
        r.map_err(|e| errs.push(e)).ok()
    }
    let sandbox = if wasm {
        ok(Sandbox::of(cfg, model_dir), errs)
    } else {
        // Not read for other models, but a path out of the model directory is refused anyway.
        if let Some(dir) = cfg.parameter_set(READ_DIR_KEY) {
            ok(confine_read_dir(model_dir, dir), errs);
        }
        None
    };
    let onnx = if cfg.is_onnx() {
        ok(OnnxOptions::of(cfg), errs).unwrap_or_default()
    } else {
        OnnxOptions::default()
    };
    let embeddings = ok(EmbeddingApi::of(cfg), errs).flatten().map(Arc::new);
    let sla = ok(Sla::of(cfg), errs).flatten();
    let gate = ok(Gate::of(cfg), errs).flatten();
    Params {
        sandbox,
        onnx,
        embeddings,
        sla,
        gate,
    }
}

/// `wasm.allow_read_dir`'s directory, which must stay inside the model directory.
fn confine_read_dir(model_dir: &Path, dir: &str) -> Result<std::path::PathBuf, ConfigError> {
    crate::repository::confine(model_dir, dir).map_err(|why| bad(READ_DIR_KEY, why))
}

fn bad(key: &str, message: String) -> ConfigError {
    ConfigError {
        path: format!("parameters.{key}"),
        message,
    }
}

/// A plugin's sandbox as its config asks for it. Everything is denied unless granted: no
/// filesystem, no environment, no network (there is no key to grant it), and a frozen clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    /// Linear-memory cap per instance, in bytes.
    pub memory_bytes: usize,
    /// Deadline for one `execute` (or `init`) call, host calls included.
    pub timeout: Duration,
    /// Fuel per call; `None` = unmetered.
    pub fuel: Option<u64>,
    /// Names of the server's environment variables the plugin may read (their values are read
    /// when it loads).
    pub allow_env: Vec<String>,
    /// Real clocks instead of a frozen one.
    pub clock: bool,
    /// Host directory, inside the model directory, mounted read-only in the plugin.
    pub read_dir: Option<PathBuf>,
    /// Whether a short call may run on the thread that received the request.
    pub on_caller: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            memory_bytes: 256 << 20,
            timeout: Duration::from_millis(5000),
            fuel: None,
            allow_env: Vec::new(),
            clock: false,
            read_dir: None,
            on_caller: true,
        }
    }
}

fn uint(cfg: &ModelConfig, key: &str) -> Result<Option<u64>, ConfigError> {
    match cfg.parameter_set(key) {
        None => Ok(None),
        Some(v) => v
            .parse::<u64>()
            .map(Some)
            .map_err(|_| bad(key, format!("must be a non-negative integer, got '{v}'"))),
    }
}

impl Sandbox {
    /// Reads the `wasm.*` parameters of `cfg`; `model_dir` anchors `wasm.allow_read_dir`,
    /// which must name a directory inside it.
    pub fn of(cfg: &ModelConfig, model_dir: &Path) -> Result<Sandbox, ConfigError> {
        let mut sandbox = Sandbox::default();
        if let Some(mb) = uint(cfg, MEMORY_LIMIT_KEY)? {
            if mb == 0 || mb > MAX_MEMORY_MB {
                return Err(bad(
                    MEMORY_LIMIT_KEY,
                    format!("must be between 1 and {MAX_MEMORY_MB}, got {mb}"),
                ));
            }
            sandbox.memory_bytes = (mb as usize) << 20;
        }
        if let Some(ms) = uint(cfg, TIMEOUT_KEY)? {
            if ms == 0 {
                return Err(bad(TIMEOUT_KEY, "must be at least 1".into()));
            }
            sandbox.timeout = Duration::from_millis(ms);
        }
        sandbox.fuel = uint(cfg, FUEL_KEY)?.filter(|&f| f > 0);
        if let Some(names) = cfg.parameter(ENV_KEY) {
            sandbox.allow_env = names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect();
        }
        sandbox.clock = match cfg.parameter_set(CLOCK_KEY) {
            None | Some("false") => false,
            Some("true") => true,
            Some(v) => return Err(bad(CLOCK_KEY, format!("must be true or false, got '{v}'"))),
        };
        sandbox.on_caller = match cfg.parameter_set(ON_CALLER_KEY) {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => {
                return Err(bad(
                    ON_CALLER_KEY,
                    format!("must be true or false, got '{v}'"),
                ))
            }
        };
        if let Some(dir) = cfg.parameter_set(READ_DIR_KEY) {
            let path = confine_read_dir(model_dir, dir)?;
            if !path.is_dir() {
                // Named as the config does: the server's own paths are not for clients.
                return Err(bad(
                    READ_DIR_KEY,
                    format!("'{dir}' is not a directory in the model directory"),
                ));
            }
            sandbox.read_dir = Some(path);
        }
        Ok(sandbox)
    }
}

/// How a model's vectors may be shortened on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimensions {
    /// Only the model's own size.
    Fixed,
    /// Any size from 1 up: the first N values, scaled back to unit length.
    Truncate,
}

/// How one model maps onto the embeddings API (its config's `openai.*` parameters).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingApi {
    /// The input that takes the texts.
    pub input: String,
    /// The output with the vectors.
    pub output: String,
    /// The output with each text's token count, if any.
    pub usage: Option<String>,
    /// The vector size.
    pub size: usize,
    /// Whether clients may ask for fewer dimensions.
    pub dimensions: Dimensions,
    /// Texts per request at most.
    pub max_inputs: usize,
}

impl EmbeddingApi {
    /// The model's mapping: `Ok(None)` when it does not join the API, an error naming the
    /// parameter when its `openai.*` parameters do not fit its signature.
    pub fn of(cfg: &ModelConfig) -> Result<Option<EmbeddingApi>, ConfigError> {
        let param = |key: &str| cfg.parameter_set(key);
        match param("openai.api") {
            None => return Ok(None),
            Some("embeddings") => {}
            Some(other) => {
                return Err(bad(
                    "openai.api",
                    format!("must be 'embeddings', not '{other}'"),
                ))
            }
        }
        let input = match param("openai.input") {
            Some(name) => cfg
                .input
                .iter()
                .find(|i| i.name == name)
                .ok_or_else(|| bad("openai.input", format!("names no input: '{name}'")))?,
            None => match cfg.input.as_slice() {
                [only] => only,
                _ => {
                    return Err(bad(
                        "openai.input",
                        "is needed: the model has more than one input".into(),
                    ))
                }
            },
        };
        if input.data_type != Some(DataType::Bytes) || !matches!(input.dims[..], [1] | [-1]) {
            return Err(bad(
                "openai.input",
                format!(
                    "must name a TYPE_STRING input of dims [1]: '{}'",
                    input.name
                ),
            ));
        }
        let output = match param("openai.output") {
            Some(name) => cfg
                .output
                .iter()
                .find(|o| o.name == name)
                .ok_or_else(|| bad("openai.output", format!("names no output: '{name}'")))?,
            None => {
                let mut fp32 = cfg
                    .output
                    .iter()
                    .filter(|o| o.data_type == Some(DataType::Fp32));
                match (fp32.next(), fp32.next()) {
                    (Some(only), None) => only,
                    _ => {
                        return Err(bad(
                            "openai.output",
                            "is needed: the model has no single FP32 output".into(),
                        ))
                    }
                }
            }
        };
        let size = match output.dims[..] {
            [n] if output.data_type == Some(DataType::Fp32) && n > 0 => n as usize,
            _ => {
                return Err(bad(
                    "openai.output",
                    format!(
                        "must name a TYPE_FP32 output of fixed dims [N]: '{}'",
                        output.name
                    ),
                ))
            }
        };
        let usage = match param("openai.usage") {
            None => None,
            Some(name) => {
                let o = cfg
                    .output
                    .iter()
                    .find(|o| o.name == name)
                    .ok_or_else(|| bad("openai.usage", format!("names no output: '{name}'")))?;
                let integer = matches!(o.data_type, Some(DataType::Int32 | DataType::Int64));
                if !integer || !matches!(o.dims[..], [1] | [-1]) {
                    return Err(bad(
                        "openai.usage",
                        format!("must name a TYPE_INT32/64 output of dims [1]: '{name}'"),
                    ));
                }
                Some(o.name.clone())
            }
        };
        let dimensions = match param("openai.dimensions") {
            None | Some("fixed") => Dimensions::Fixed,
            Some("truncate") => Dimensions::Truncate,
            Some(other) => {
                return Err(bad(
                    "openai.dimensions",
                    format!("must be 'fixed' or 'truncate', not '{other}'"),
                ))
            }
        };
        let max_inputs = match param("openai.max_inputs") {
            None => MAX_EMBEDDING_INPUTS,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_EMBEDDING_INPUTS).contains(n))
                .ok_or_else(|| {
                    bad(
                        "openai.max_inputs",
                        format!("must be 1 to {MAX_EMBEDDING_INPUTS}, not '{v}'"),
                    )
                })?,
        };
        Ok(Some(EmbeddingApi {
            input: input.name.clone(),
            output: output.name.clone(),
            usage,
            size,
            dimensions,
            max_inputs,
        }))
    }
}

/// A model's declared SLA: a newly loaded version is watched against it and rolled back when
/// it breaches it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sla {
    /// The p99 latency bound, if any.
    pub p99: Option<Duration>,
    /// The error-rate bound, if any.
    pub max_error_rate: Option<f64>,
    /// How long a new version is watched.
    pub window: Duration,
    /// Requests needed before a breach is judged.
    pub min_requests: u64,
}

impl Sla {
    /// The SLA `cfg` declares: `Ok(None)` when it declares none, an error naming the parameter
    /// when a value is malformed or out of bounds.
    pub fn of(cfg: &ModelConfig) -> Result<Option<Sla>, ConfigError> {
        let param = |key: &str| cfg.parameter_set(key);
        let out_of = |key: &str, why: &str, value: &str| bad(key, format!("{why}, not '{value}'"));
        let p99 = match param(P99_KEY) {
            None => None,
            Some(v) => match v.parse::<f64>() {
                Ok(ms) if ms > 0.0 && ms <= 3_600_000.0 => {
                    Some(Duration::from_secs_f64(ms / 1000.0))
                }
                _ => return Err(out_of(P99_KEY, "must be milliseconds in (0, 3600000]", v)),
            },
        };
        let max_error_rate = match param(ERROR_RATE_KEY) {
            None => None,
            Some(v) => match v.parse::<f64>() {
                Ok(r) if (0.0..1.0).contains(&r) => Some(r),
                _ => return Err(out_of(ERROR_RATE_KEY, "must be a fraction in [0, 1)", v)),
            },
        };
        let window = match param(WINDOW_KEY) {
            None => DEFAULT_WINDOW,
            Some(v) => match v.parse::<u64>() {
                Ok(s @ 1..=86_400) => Duration::from_secs(s),
                _ => return Err(out_of(WINDOW_KEY, "must be whole seconds in 1..=86400", v)),
            },
        };
        let min_requests = match param(MIN_REQUESTS_KEY) {
            None => DEFAULT_MIN_REQUESTS,
            Some(v) => match v.parse::<u64>() {
                Ok(n @ 1..=1_000_000) => n,
                _ => {
                    return Err(out_of(
                        MIN_REQUESTS_KEY,
                        "must be a count in 1..=1000000",
                        v,
                    ))
                }
            },
        };
        if p99.is_none() && max_error_rate.is_none() {
            if let Some(key) = [WINDOW_KEY, MIN_REQUESTS_KEY]
                .into_iter()
                .find(|k| param(k).is_some())
            {
                return Err(bad(key, format!("needs '{P99_KEY}' or '{ERROR_RATE_KEY}'")));
            }
            return Ok(None);
        }
        Ok(Some(Sla {
            p99,
            max_error_rate,
            window,
            min_requests,
        }))
    }
}
