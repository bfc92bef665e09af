//! A plugin's sandbox: limits and grants, read from the model config's `parameters`.
//!
//! Everything is denied unless granted: no filesystem, no environment, no network (there is no
//! key to grant it), and a frozen clock. The limits have safe defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use wisp_core::config::ModelConfig;
use wisp_core::env::EnvSource;
use wisp_core::{Error, Result};

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

/// Where a granted directory appears inside the plugin.
pub const GUEST_DATA_DIR: &str = "/data";

/// The largest memory cap a model may ask for (the pooling allocator reserves this much address
/// space per memory slot).
pub const MAX_MEMORY_MB: u64 = 4096;

/// A model's sandbox settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Linear-memory cap per instance, in bytes.
    pub memory_bytes: usize,
    /// Deadline for one `execute` (or `init`) call, host calls included.
    pub timeout: Duration,
    /// Fuel per call; `None` = unmetered.
    pub fuel: Option<u64>,
    /// Environment variables (name, value) copied in at instantiation.
    pub env: Vec<(String, String)>,
    /// Real clocks instead of a frozen one.
    pub clock: bool,
    /// Host directory mounted read-only at [`GUEST_DATA_DIR`].
    pub read_dir: Option<PathBuf>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 256 << 20,
            timeout: Duration::from_millis(5000),
            fuel: None,
            env: Vec::new(),
            clock: false,
            read_dir: None,
        }
    }
}

fn uint(cfg: &ModelConfig, key: &str) -> Result<Option<u64>> {
    match cfg.parameter(key).map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            Error::invalid(format!(
                "model '{}': parameters.{key} must be a non-negative integer, got '{v}'",
                cfg.name
            ))
        }),
    }
}

impl Limits {
    /// Reads the `wasm.*` parameters of `cfg`; `model_dir` anchors `wasm.allow_read_dir`, and
    /// the variables `wasm.allow_env` grants are read from `env`.
    pub fn from_config(cfg: &ModelConfig, model_dir: &Path, env: &dyn EnvSource) -> Result<Self> {
        let mut limits = Limits::default();
        if let Some(mb) = uint(cfg, MEMORY_LIMIT_KEY)? {
            if mb == 0 || mb > MAX_MEMORY_MB {
                return Err(Error::invalid(format!(
                    "model '{}': parameters.{MEMORY_LIMIT_KEY} must be between 1 and {MAX_MEMORY_MB}, got {mb}",
                    cfg.name
                )));
            }
            limits.memory_bytes = (mb as usize) << 20;
        }
        if let Some(ms) = uint(cfg, TIMEOUT_KEY)? {
            if ms == 0 {
                return Err(Error::invalid(format!(
                    "model '{}': parameters.{TIMEOUT_KEY} must be at least 1",
                    cfg.name
                )));
            }
            limits.timeout = Duration::from_millis(ms);
        }
        limits.fuel = uint(cfg, FUEL_KEY)?.filter(|&f| f > 0);
        if let Some(names) = cfg.parameter(ENV_KEY) {
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                if let Some(value) = env.var(name) {
                    limits.env.push((name.to_string(), value));
                }
            }
        }
        limits.clock = match cfg.parameter(CLOCK_KEY).map(str::trim) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(v) => {
                return Err(Error::invalid(format!(
                    "model '{}': parameters.{CLOCK_KEY} must be true or false, got '{v}'",
                    cfg.name
                )))
            }
        };
        if let Some(dir) = cfg.parameter(READ_DIR_KEY).filter(|d| !d.trim().is_empty()) {
            let path = wisp_core::repository::confine(model_dir, dir.trim()).map_err(|why| {
                Error::invalid(format!(
                    "model '{}': parameters.{READ_DIR_KEY}: {why}",
                    cfg.name
                ))
            })?;
            if !path.is_dir() {
                return Err(Error::invalid(format!(
                    "model '{}': parameters.{READ_DIR_KEY}: {} is not a directory",
                    cfg.name,
                    path.display()
                )));
            }
            limits.read_dir = Some(path);
        }
        Ok(limits)
    }
}

/// The `wasm.allow_env` names of a config, trimmed, empty names dropped.
fn env_names(cfg: &ModelConfig) -> Vec<&str> {
    cfg.parameter(ENV_KEY)
        .map(|names| {
            names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The most elements a plugin's table may grow to.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// A plugin store's resource limiter: linear memory is capped at `wasm.memory_limit_mb`, and a
/// growth past it traps with [`MemoryDenied`], so that the failure is known to be memory
/// exhaustion by its type rather than by wasmtime's wording.
#[derive(Debug)]
pub(crate) struct Limiter {
    /// The cap on one linear memory, in bytes.
    pub(crate) memory_bytes: usize,
}

/// A plugin's linear memory was not allowed to grow (past its cap, or the allocator had no
/// room): the trap that ends its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryDenied {
    /// The size asked for, in bytes, when the limiter refused it.
    pub desired: Option<usize>,
}

impl std::fmt::Display for MemoryDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.desired {
            Some(n) => write!(f, "linear memory may not grow to {n} bytes"),
            None => f.write_str("linear memory could not grow"),
        }
    }
}

impl std::error::Error for MemoryDenied {}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes || maximum.is_some_and(|m| desired > m) {
            return Err(wasmtime::Error::new(MemoryDenied {
                desired: Some(desired),
            }));
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context(MemoryDenied { desired: None }))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS && maximum.is_none_or(|m| desired <= m))
    }
}

/// Checks that `over`, a config that arrived with a load request, grants a plugin no more than
/// `base`, the repository's own config, does: grants may only be dropped and limits only
/// lowered. Capability grants come from the repository's files, never from the network.
pub fn check_override_narrows(
    base: &ModelConfig,
    over: &ModelConfig,
    model_dir: &Path,
) -> Result<()> {
    let deny = |key: &str, why: String| {
        Err(Error::invalid(format!(
            "model '{}': the load request's config may not widen parameters.{key} beyond the repository's config.pbtxt: {why}",
            over.name
        )))
    };
    // Only the names of granted variables are compared, never their values.
    let no_env = std::collections::HashMap::new();
    let b = Limits::from_config(base, model_dir, &no_env)?;
    let o = Limits::from_config(over, model_dir, &no_env)?;
    if o.memory_bytes > b.memory_bytes {
        return deny(
            MEMORY_LIMIT_KEY,
            format!("{} MB > {} MB", o.memory_bytes >> 20, b.memory_bytes >> 20),
        );
    }
    if o.timeout > b.timeout {
        return deny(
            TIMEOUT_KEY,
            format!(
                "{} ms > {} ms",
                o.timeout.as_millis(),
                b.timeout.as_millis()
            ),
        );
    }
    if let Some(bf) = b.fuel {
        if o.fuel.is_none_or(|of| of > bf) {
            return deny(
                FUEL_KEY,
                format!("the repository meters {bf} fuel per call"),
            );
        }
    }
    if o.clock && !b.clock {
        return deny(CLOCK_KEY, "the repository does not grant the clock".into());
    }
    let granted = env_names(base);
    if let Some(extra) = env_names(over).into_iter().find(|n| !granted.contains(n)) {
        return deny(ENV_KEY, format!("'{extra}' is not granted"));
    }
    if let Some(dir) = &o.read_dir {
        if !b
            .read_dir
            .as_ref()
            .is_some_and(|root| dir.starts_with(root))
        {
            return deny(
                READ_DIR_KEY,
                "only the repository's granted directory or one inside it".into(),
            );
        }
    }
    if let Some(key) = over.parameters.keys().find(|k| {
        k.starts_with("wasm.")
            && ![
                MEMORY_LIMIT_KEY,
                TIMEOUT_KEY,
                FUEL_KEY,
                ENV_KEY,
                CLOCK_KEY,
                READ_DIR_KEY,
            ]
            .contains(&k.as_str())
    }) {
        return Err(Error::invalid(format!(
            "model '{}': unknown sandbox parameter '{key}'",
            over.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::config::ModelParameter;
    use wisp_core::env::ProcessEnv;

    fn cfg(params: &[(&str, &str)]) -> ModelConfig {
        let mut c = ModelConfig {
            name: "p".into(),
            ..Default::default()
        };
        for (k, v) in params {
            c.parameters.insert(
                k.to_string(),
                ModelParameter {
                    string_value: v.to_string(),
                },
            );
        }
        c
    }

    #[test]
    fn defaults_deny_everything() {
        let l = Limits::from_config(&cfg(&[]), Path::new("."), &ProcessEnv).unwrap();
        assert_eq!(l, Limits::default());
        assert!(l.env.is_empty() && !l.clock && l.read_dir.is_none() && l.fuel.is_none());
    }

    #[test]
    fn reads_grants_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("assets")).unwrap();
        let l = Limits::from_config(
            &cfg(&[
                (MEMORY_LIMIT_KEY, "16"),
                (TIMEOUT_KEY, "250"),
                (FUEL_KEY, "1000"),
                (ENV_KEY, "WISP_LIMITS_TEST_VAR, WISP_LIMITS_UNSET_VAR"),
                (CLOCK_KEY, "true"),
                (READ_DIR_KEY, "assets"),
            ]),
            dir.path(),
            &std::collections::HashMap::from([(
                "WISP_LIMITS_TEST_VAR".to_string(),
                "yes".to_string(),
            )]),
        )
        .unwrap();
        assert_eq!(l.memory_bytes, 16 << 20);
        assert_eq!(l.timeout, Duration::from_millis(250));
        assert_eq!(l.fuel, Some(1000));
        assert_eq!(
            l.env,
            vec![("WISP_LIMITS_TEST_VAR".to_string(), "yes".to_string())]
        );
        assert!(l.clock);
        assert_eq!(l.read_dir, Some(dir.path().join("assets")));
    }

    #[test]
    fn bad_values_name_the_key() {
        for (k, v) in [
            (MEMORY_LIMIT_KEY, "0"),
            (MEMORY_LIMIT_KEY, "99999"),
            (TIMEOUT_KEY, "soon"),
            (CLOCK_KEY, "yes"),
            (READ_DIR_KEY, "missing"),
            (READ_DIR_KEY, "/"),
            (READ_DIR_KEY, ".."),
        ] {
            let e = Limits::from_config(&cfg(&[(k, v)]), Path::new("."), &ProcessEnv).unwrap_err();
            assert!(e.message().contains(k), "{k}={v}: {}", e.message());
        }
    }

    #[test]
    fn an_override_may_narrow_but_never_widen() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("assets/inner")).unwrap();
        let base = cfg(&[
            (MEMORY_LIMIT_KEY, "64"),
            (ENV_KEY, "A,B"),
            (READ_DIR_KEY, "assets"),
            (FUEL_KEY, "1000"),
        ]);
        let ok = |params: &[(&str, &str)]| check_override_narrows(&base, &cfg(params), dir.path());
        ok(&[(MEMORY_LIMIT_KEY, "32"), (FUEL_KEY, "10")]).unwrap();
        ok(&[
            (ENV_KEY, "B"),
            (READ_DIR_KEY, "assets/inner"),
            (FUEL_KEY, "1000"),
            (MEMORY_LIMIT_KEY, "64"),
        ])
        .unwrap();
        for (params, key) in [
            (
                vec![(FUEL_KEY, "1000"), (MEMORY_LIMIT_KEY, "128")],
                MEMORY_LIMIT_KEY,
            ),
            (vec![(FUEL_KEY, "1000")], MEMORY_LIMIT_KEY), // the default 256 is wider
            (vec![(MEMORY_LIMIT_KEY, "8")], FUEL_KEY),
            (vec![(MEMORY_LIMIT_KEY, "8"), (FUEL_KEY, "1001")], FUEL_KEY),
            (
                vec![
                    (MEMORY_LIMIT_KEY, "8"),
                    (FUEL_KEY, "1"),
                    (ENV_KEY, "A,HOME"),
                ],
                ENV_KEY,
            ),
            (
                vec![
                    (MEMORY_LIMIT_KEY, "8"),
                    (FUEL_KEY, "1"),
                    (CLOCK_KEY, "true"),
                ],
                CLOCK_KEY,
            ),
            (
                vec![
                    (MEMORY_LIMIT_KEY, "8"),
                    (FUEL_KEY, "1"),
                    (READ_DIR_KEY, "."),
                ],
                READ_DIR_KEY,
            ),
            (
                vec![
                    (MEMORY_LIMIT_KEY, "8"),
                    (FUEL_KEY, "1"),
                    (TIMEOUT_KEY, "9000"),
                ],
                TIMEOUT_KEY,
            ),
            (
                vec![
                    (MEMORY_LIMIT_KEY, "8"),
                    (FUEL_KEY, "1"),
                    ("wasm.allow_net", "true"),
                ],
                "wasm.allow_net",
            ),
        ] {
            let e = ok(&params).unwrap_err();
            assert!(e.message().contains(key), "{params:?}: {}", e.message());
        }
    }
}
