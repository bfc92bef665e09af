//! The rule that a network config may only narrow a plugin's sandbox (checked by the model
//! loader when a load request brings a config).

use std::path::Path;

use super::{
    Sandbox, CLOCK_KEY, ENV_KEY, FUEL_KEY, MEMORY_LIMIT_KEY, ON_CALLER_KEY, READ_DIR_KEY,
    SANDBOX_KEYS, TIMEOUT_KEY,
};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// Checks that `over`, a config that arrived with a load request (validated, its sandbox read
/// into `o`), grants a plugin no more than `base`, the repository's own config, does: grants
/// may only be dropped and limits only lowered. Capability grants come from the repository's
/// files, never from the network.
pub fn check_override_narrows(
    base: &ModelConfig,
    over: &ModelConfig,
    o: &Sandbox,
    model_dir: &Path,
) -> Result<()> {
    let deny = |key: &str, why: String| {
        Err(Error::invalid(format!(
            "model '{}': the load request's config may not widen parameters.{key} beyond the repository's config.pbtxt: {why}",
            over.name
        )))
    };
    let b = Sandbox::of(base, model_dir)
        .map_err(|e| Error::invalid(format!("model '{}': {}: {}", base.name, e.path, e.message)))?;
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
    if o.on_caller && !b.on_caller {
        return deny(
            ON_CALLER_KEY,
            "the repository keeps this plugin on its own threads".into(),
        );
    }
    if o.clock && !b.clock {
        return deny(CLOCK_KEY, "the repository does not grant the clock".into());
    }
    // Only the names of granted variables are compared, never their values.
    if let Some(extra) = o.allow_env.iter().find(|n| !b.allow_env.contains(n)) {
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
    if let Some(key) = over
        .parameters
        .keys()
        .find(|k| k.starts_with("wasm.") && !SANDBOX_KEYS.contains(&k.as_str()))
    {
        return Err(Error::invalid(format!(
            "model '{}': unknown sandbox parameter '{key}'",
            over.name
        )));
    }
    Ok(())
}
