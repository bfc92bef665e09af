//! The contract between the model lifecycle and a backend (ONNX, wasm, ...).
//!
//! A [`Backend`] describes a model file (for auto-complete) and loads a version into a
//! [`LoadedModel`], which creates [`Instance`]s. Each instance runs on its own thread and
//! executes a whole batch of requests at a time, as in Triton's backend API.

use std::path::Path;
use std::time::Instant;

use crate::config::{ModelIo, ModelSpec};
use crate::error::Result;
use crate::infer::{InferRequest, InferResponse};

/// A kind of model (one per `backend`/`platform`).
pub trait Backend: Send + Sync {
    /// The inputs and outputs the model file declares.
    fn describe(&self, model_file: &Path) -> Result<ModelIo>;
    /// Loads one version of a model from `model_file` with its validated spec.
    fn load(&self, spec: &ModelSpec, model_file: &Path) -> Result<Box<dyn LoadedModel>>;
}

/// One loaded model version, shared by its instances.
pub trait LoadedModel: Send + Sync {
    /// The engine that runs it (`"onnxruntime"`, `"tract"`), shown in metadata and logs.
    fn engine(&self) -> &str;
    /// Creates instance number `index` (each instance owns its own session/state).
    fn new_instance(&self, index: usize) -> Result<Box<dyn Instance>>;
    /// Labels for outputs whose config names no `label_filename`, found by the backend: an
    /// ensemble takes them from the composing model that produces each output.
    fn output_labels(&self) -> Vec<(String, std::sync::Arc<Vec<String>>)> {
        Vec::new()
    }
    /// For an ensemble, per step (in config order): the step's model and how many times the
    /// step did not run because an input it requires was not produced. Empty for others.
    fn step_skips(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// One model instance: executes batches on the thread that owns it.
pub trait Instance: Send {
    /// Executes a batch of requests, returning one result per request, in order. The requests
    /// have been validated against the model config; with `max_batch_size > 0` their inputs
    /// carry the batch dimension and may be concatenated. The backend fills `timing` with where
    /// the time went (left at zero, the whole call counts as inference).
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>>;

    /// Called once on the thread that will run this instance, before its first batch: where
    /// thread placement (CPU pinning) happens. Whoever starts an instance thread calls it; a
    /// call of `execute` from another thread (warm-up on the loader) never does.
    fn on_thread_start(&mut self) {}

    /// Whether a short execution may run on the thread that submits the request instead of
    /// this instance's own (the scheduler's fast path when the instance is idle and nothing is
    /// queued). Only for instances that need no thread placement, and that never block
    /// waiting on other models unless they also [`Instance::may_stall`]; the default is no.
    fn runs_on_caller(&self) -> bool {
        false
    }

    /// Whether an execution on a caller's thread may take long, however short recent ones
    /// were (a plugin runs guest code until its deadline): such an execution runs on a
    /// caller only with the caller's permit (an async front end grants it to all but one of
    /// its workers at once).
    fn may_stall(&self) -> bool {
        false
    }
}

/// Where one batch execution spent its time, in nanoseconds (Triton's compute_input,
/// compute_infer and compute_output statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecTiming {
    /// Gathering and converting inputs.
    pub input_ns: u64,
    /// Running the model.
    pub infer_ns: u64,
    /// Converting and splitting outputs.
    pub output_ns: u64,
}

/// How plugins (and ensembles) reach the server's models: implemented by the registry
/// (`wisp-models`), called by the wasm backend's `models` and wasi-nn hosts.
pub trait ModelCaller: Send + Sync {
    /// Checks that `model` (at `version`, else its default version) is served and ready.
    fn check(&self, model: &str, version: Option<&str>) -> Result<()>;
    /// Runs `request` through `model`'s scheduler, waiting at most until `deadline`. A traced
    /// plugin request's calls carry its trace in `request.trace`, for the caller to record the
    /// call under.
    fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse>;

    /// Runs `requests` through `model`'s scheduler all at once (so they batch), waiting at
    /// most until `deadline`: one result per request, in order. The outer error is for the
    /// call as a whole (an unknown or unready model). Traced requests carry their parent trace
    /// in `request.trace`, as in [`ModelCaller::infer`].
    fn infer_batch(
        &self,
        model: &str,
        version: Option<&str>,
        requests: Vec<InferRequest>,
        deadline: Instant,
    ) -> Result<Vec<Result<InferResponse>>>;
}
