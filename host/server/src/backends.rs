//! The server's one [`Backend`]: it sends each model to ONNX Runtime/tract, wasmtime or the
//! ensemble DAG.

use std::path::Path;

use wisp_backend_onnx::OnnxBackend;
use wisp_core::backend::{Backend, LoadedModel};
use wisp_core::config::{ModelIo, ModelSpec};
use wisp_core::Result;
use wisp_plugin_runtime::WasmBackend;

/// The server's backends: `backend: "wasm"` models go to wasmtime, `platform: "ensemble"` to
/// the ensemble DAG, the rest to ONNX.
pub struct Backends {
    /// ONNX models.
    pub onnx: OnnxBackend,
    /// Plugins.
    pub wasm: WasmBackend,
    /// Ensembles.
    pub ensemble: crate::models::ensemble::EnsembleBackend,
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
