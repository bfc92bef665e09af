//! The protocol-neutral service layer: what Triton's in-process C API is to its front ends.
//!
//! HTTP ([`crate::http`]) and gRPC ([`crate::grpc`]) are codecs over one [`Service`]: they parse
//! their wire format, call it, and encode what it returns, each mapping errors to statuses in
//! one table. Everything a protocol does not dictate lives here, once, so the two give identical
//! answers to identical questions:
//!
//! - [`infer`]: resolve → validate → cache → schedule → select outputs / classify; the one
//!   writer of front-end failures into statistics.
//! - [`stream`]: the same for a decoupled model, whose responses stream as it sends them.
//! - [`query`]: server and model metadata, readiness, configs, statistics and the repository
//!   index, as plain structs.
//! - [`control`]: model load and unload with the control-mode and override policy, and log
//!   settings.

pub mod control;
pub mod infer;
pub mod openai;
pub mod otel;
pub mod query;
pub mod shm;
pub mod stream;
pub mod trace;

use std::sync::Arc;

use crate::cache::ResponseCache;
use crate::logging::LogControl;
use crate::models::Registry;
use crate::settings::ControlMode;

pub use infer::{Answer, Decoded, OutputSpec, ShmInput, MAX_CLASSIFICATION};

/// Extensions this server implements (reported by server metadata on both protocols).
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "parameters",
    "schedule_policy",
    "sequence",
    "statistics",
    "system_shared_memory",
    "trace",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
];

/// The service every front end calls.
pub struct Service {
    /// Loaded models.
    pub registry: Arc<Registry>,
    /// The response cache (`--cache-config`), if any.
    pub cache: Option<Arc<ResponseCache>>,
    /// Ready only if every model is ready (`--strict-readiness`).
    pub strict_readiness: bool,
    /// The models that failed to load at start-up: under strict readiness the server is not
    /// ready while one of them stays loaded and not ready (Triton would have exited). A model
    /// that fails a later load, or a load request's upload, does not change readiness, as in
    /// Triton, where only live (ready) versions count.
    pub startup_failures: Vec<String>,
    /// Model control mode (load/unload allowed only in explicit mode).
    pub control_mode: ControlMode,
    /// Which network front ends may load and unload in explicit mode.
    pub network_control: control::NetworkControl,
    /// `--require-signed-models`: a load request may not replace a model's (signed) config.
    pub signed_only: bool,
    /// Logging settings (logging extension).
    pub logging: LogControl,
    /// The in-flight request memory budget in KiB (`--max-inflight-bytes`), shared by both
    /// protocols.
    pub budget: Arc<tokio::sync::Semaphore>,
    /// Registered system shared memory regions (the shared memory extension).
    pub shm: shm::SharedMemory,
    /// Trace settings and finished traces (the trace extension).
    pub trace: trace::TraceControl,
    /// Object-store repositories, whose mirrors an explicit load brings up to date.
    pub(crate) remotes: crate::Remotes,
}

/// A request's share of the in-flight budget, grown as its memory grows (a body as it arrives
/// or inflates), so that memory is charged before it is spent.
pub struct Charge {
    budget: Arc<tokio::sync::Semaphore>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    kib: u32,
}

impl Charge {
    /// Nothing charged yet.
    pub fn new(budget: &Arc<tokio::sync::Semaphore>) -> Self {
        Charge {
            budget: budget.clone(),
            permit: None,
            kib: 0,
        }
    }

    /// Charges up to `bytes` in all (nothing when as much is charged already); when the budget
    /// cannot cover it, RESOURCE_EXHAUSTED (HTTP 503), and what was charged stays until drop.
    pub fn grow_to(&mut self, bytes: u64) -> wisp_core::Result<()> {
        let want = u32::try_from(bytes / 1024 + 1).unwrap_or(u32::MAX);
        if want <= self.kib {
            return Ok(());
        }
        let more = self
            .budget
            .clone()
            .try_acquire_many_owned(want - self.kib)
            .map_err(|_| {
                tracing::warn!(bytes, "request refused: the in-flight memory budget is spent");
                wisp_core::Error::exhausted(
                    "the server is at its in-flight request memory budget (--max-inflight-bytes); retry later",
                )
            })?;
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
        self.kib = want;
        Ok(())
    }
}

impl Service {
    /// Reserves `bytes` of the in-flight budget for one request until the returned charge drops; when
    /// the budget is spent the request is refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) instead
    /// of queued, so memory stays bounded under a burst of large requests.
    pub fn admit(&self, bytes: u64) -> wisp_core::Result<Charge> {
        let mut charge = Charge::new(&self.budget);
        charge.grow_to(bytes)?;
        Ok(charge)
    }
}
