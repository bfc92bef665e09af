//! How the server hosts plugins: one [`Backend`] choosing ONNX or wasm per model, and the
//! [`ModelCaller`] through which a plugin's wasi-nn calls reach the server's other models.

use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use wisp_backend_onnx::OnnxBackend;
use wisp_core::backend::{Backend, LoadedModel};
use wisp_core::config::{ModelConfig, ModelIo};
use wisp_core::{Error, InferRequest, InferResponse, Result};
use wisp_plugin_runtime::{ModelCaller, WasmBackend};

use crate::registry::Registry;

/// The server's backends: `backend: "wasm"` models go to wasmtime, `platform: "ensemble"` to
/// the ensemble DAG, the rest to ONNX.
pub struct Backends {
    /// ONNX models.
    pub onnx: OnnxBackend,
    /// Plugins.
    pub wasm: WasmBackend,
    /// Ensembles.
    pub ensemble: crate::ensemble::EnsembleBackend,
}

impl Backend for Backends {
    fn describe(&self, model_file: &Path) -> Result<ModelIo> {
        if model_file.extension().is_some_and(|e| e == "wasm") {
            self.wasm.describe(model_file)
        } else {
            self.onnx.describe(model_file)
        }
    }

    fn load(&self, config: &ModelConfig, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        if config.is_wasm() {
            self.wasm.load(config, model_file)
        } else if config.is_ensemble() {
            self.ensemble.load(config, model_file)
        } else {
            self.onnx.load(config, model_file)
        }
    }
}

/// Validates a plugin's or an ensemble step's request against the model it calls; a failure
/// counts in that model's statistics, as it would over HTTP or gRPC.
fn validate(m: &crate::registry::ModelVersion, request: &InferRequest) -> Result<()> {
    wisp_core::infer::validate(request, &m.config).inspect_err(|_| {
        m.stats()
            .record_failure(wisp_scheduler::FailReason::Other, std::time::Duration::ZERO);
    })
}

/// Resolves plugin wasi-nn calls against the registry (set once the registry exists).
#[derive(Default)]
pub struct RegistryCaller {
    registry: OnceLock<Weak<Registry>>,
}

impl RegistryCaller {
    /// Points the caller at `registry` (later calls are ignored).
    pub fn attach(&self, registry: &Arc<Registry>) {
        let _ = self.registry.set(Arc::downgrade(registry));
    }

    fn registry(&self) -> Result<Arc<Registry>> {
        self.registry
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::unavailable("the server is shutting down"))
    }
}

impl RegistryCaller {
    /// The config of a served, ready model.
    pub fn config(&self, model: &str, version: Option<&str>) -> Result<Arc<ModelConfig>> {
        Ok(self.registry()?.get(model, version)?.config.clone())
    }

    /// Queues `request` on `model` (validated against its config); `respond` gets the outcome.
    pub fn submit(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        respond: wisp_scheduler::Responder,
    ) -> Result<()> {
        let m = self.registry()?.get(model, version)?;
        validate(&m, &request)?;
        m.submit(request, respond)
    }
}

impl ModelCaller for RegistryCaller {
    fn check(&self, model: &str, version: Option<&str>) -> Result<()> {
        self.registry()?.get(model, version).map(|_| ())
    }

    fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse> {
        let m = self.registry()?.get(model, version)?;
        validate(&m, &request)?;
        m.infer_blocking(request, deadline)
    }
}
