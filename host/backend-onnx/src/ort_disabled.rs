//! Stands in for `ort_engine` in a build without the `onnxruntime` feature (the edge build):
//! asking for ONNX Runtime is an error, and tract serves every ONNX model.

use std::path::Path;

use wisp_core::{Error, Result, Tensor};

use crate::Runner;

/// Never constructed: this build cannot load ONNX Runtime.
pub(crate) enum OrtEngine {}

impl OrtEngine {
    pub(crate) fn init(lib: &Path) -> Result<Self> {
        Err(Error::invalid(format!(
            "this wisp was built without ONNX Runtime (an edge build, tract only): cannot load {}; use --onnx-engine tract",
            lib.display()
        )))
    }

    pub(crate) fn prepare(
        &self,
        _: &Path,
        _: Option<std::sync::Arc<[u8]>>,
        _: usize,
        _: usize,
        _: &wisp_core::config::params::OnnxOptions,
    ) -> Result<OrtModel> {
        match *self {}
    }
}

/// Never constructed.
pub(crate) enum OrtModel {}

impl OrtModel {
    pub(crate) fn session(&self) -> Result<OrtRunner> {
        match *self {}
    }
}

/// Never constructed.
pub(crate) enum OrtRunner {}

impl Runner for OrtRunner {
    fn run(&mut self, _: Vec<Tensor>) -> Result<Vec<Tensor>> {
        match *self {}
    }
}
