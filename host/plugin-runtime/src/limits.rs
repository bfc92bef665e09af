//! A plugin's sandbox: limits and grants, read from the model config's `parameters`.
//!
//! Everything is denied unless granted: no filesystem, no environment, no network (there is no
//! key to grant it), and a frozen clock. The limits have safe defaults.

pub use wisp_core::config::params::{
    check_override_narrows, Sandbox, CLOCK_KEY, ENV_KEY, FUEL_KEY, MAX_MEMORY_MB, MEMORY_LIMIT_KEY,
    READ_DIR_KEY, SANDBOX_KEYS, TIMEOUT_KEY,
};
use wisp_core::env::EnvSource;

/// Where a granted directory appears inside the plugin.
pub const GUEST_DATA_DIR: &str = "/data";

/// A model's sandbox settings, as its instances apply them: the config's [`Sandbox`] with the
/// values of the environment variables it grants.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Limits {
    /// The limits and grants the config asks for.
    pub sandbox: Sandbox,
    /// The granted environment variables (name, value) that were set at load, copied in at
    /// instantiation.
    pub env: Vec<(String, String)>,
}

impl Limits {
    /// The limits of `sandbox`, with the variables it grants read from `env` now (a granted
    /// variable that `env` does not hold is left out).
    pub fn new(sandbox: Sandbox, env: &dyn EnvSource) -> Self {
        let env = sandbox
            .allow_env
            .iter()
            .filter_map(|name| env.var(name).map(|value| (name.clone(), value)))
            .collect();
        Limits { sandbox, env }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::config::ModelConfig;
    use wisp_core::Error;

    fn cfg(params: &[(&str, &str)]) -> ModelConfig {
        let mut c = ModelConfig {
            name: "p".into(),
            ..Default::default()
        };
        params.iter().for_each(|(k, v)| c.set_parameter(k, v));
        c
    }

    #[test]
    fn granted_variables_are_read_when_limits_are_made() {
        let sandbox = Sandbox {
            allow_env: vec![
                "WISP_LIMITS_TEST_VAR".into(),
                "WISP_LIMITS_UNSET_VAR".into(),
            ],
            fuel: Some(1000),
            ..Sandbox::default()
        };
        let env = std::collections::HashMap::from([(
            "WISP_LIMITS_TEST_VAR".to_string(),
            "yes".to_string(),
        )]);
        let l = Limits::new(sandbox, &env);
        assert_eq!(
            l.env,
            vec![("WISP_LIMITS_TEST_VAR".to_string(), "yes".to_string())]
        );
        assert_eq!(l.sandbox.fuel, Some(1000));
        let d = Limits::default();
        assert!(d.env.is_empty() && !d.sandbox.clock && d.sandbox.read_dir.is_none());
        assert!(d.sandbox.fuel.is_none());
        assert_eq!(d.sandbox.memory_bytes, 256 << 20);
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
        let ok = |params: &[(&str, &str)]| {
            let over = cfg(params);
            let sandbox = Sandbox::of(&over, dir.path()).map_err(|e| Error::invalid(e.message))?;
            check_override_narrows(&base, &over, &sandbox, dir.path())
        };
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
