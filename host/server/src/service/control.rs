//! Changing the server: model load and unload with the control-mode and override policy, and
//! the logging extension. The refusals (and their words) are written once, here.

use wisp_core::{Error, Result};

use super::Service;
use crate::logging::LogSettings;
use crate::settings::ControlMode;

/// A load request, as the front end parsed it.
#[derive(Debug, Default)]
pub struct LoadRequest {
    /// `repository_name` (not supported when non-empty).
    pub repository: String,
    /// A JSON `ModelConfig` replacing `config.pbtxt` (may only narrow a plugin's sandbox).
    pub config: Option<String>,
    /// Whether the request carried `file:` parameters (model files from the network).
    pub has_files: bool,
}

impl Service {
    /// Refuses repository control unless the server runs in explicit mode (and for named
    /// repositories, which Wisp does not support).
    fn check_control(&self, repository: &str) -> Result<()> {
        if !repository.is_empty() {
            return Err(Error::unsupported(
                "'repository_name' specification is not supported",
            ));
        }
        if self.control_mode != ControlMode::Explicit {
            // Triton's message (it says so in every mode but explicit), then ours.
            return Err(Error::unavailable(format!(
                "explicit model load / unload is not allowed if polling is enabled (model control mode is '{}'; start with --model-control-mode explicit)",
                format!("{:?}", self.control_mode).to_lowercase()
            )));
        }
        Ok(())
    }

    /// Loads or reloads `model` (off the async workers).
    pub async fn load(&self, model: &str, req: LoadRequest) -> Result<()> {
        self.check_control(&req.repository)?;
        if req.config.is_some() && self.signed_only {
            return Err(Error::invalid(
                "a load request may not override a model's config when --require-signed-models is set (the signed config.pbtxt is what loads)",
            ));
        }
        if req.has_files {
            return Err(Error::unsupported(
                "loading model files from the request ('file:' parameters) is not supported",
            ));
        }
        let (registry, model) = (self.registry.clone(), model.to_string());
        tokio::task::spawn_blocking(move || registry.load(&model, req.config.as_deref()))
            .await
            .map_err(|_| Error::internal("model load panicked"))?
    }

    /// Unloads `model` (off the async workers); with `dependents`, also the models it composes
    /// that nothing else loaded uses (Triton's `unload_dependents`).
    pub async fn unload(&self, model: &str, repository: &str, dependents: bool) -> Result<()> {
        self.check_control(repository)?;
        let (registry, model) = (self.registry.clone(), model.to_string());
        tokio::task::spawn_blocking(move || {
            if dependents {
                registry.unload_with_dependents(&model)
            } else {
                registry.unload(&model)
            }
        })
        .await
        .map_err(|_| Error::internal("model unload panicked"))?
    }

    /// The log settings, after applying `update` (all or nothing) when it is not empty.
    pub fn log_settings(
        &self,
        update: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LogSettings> {
        if update.is_empty() {
            Ok(self.logging.get())
        } else {
            self.logging.update(update)
        }
    }
}
