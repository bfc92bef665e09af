//! The protocol-neutral service layer: what Triton's in-process C API is to its front ends.
//!
//! HTTP and gRPC (`wisp-server`'s `http` and `grpc`) are codecs over one [`Service`]: they parse
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
//!
//! [`core::Core`] opens the engines, the models and this service from plain options;
//! [`embed::Embedded`] calls it in-process, with no protocol in between.

pub mod cache;
pub mod control;
pub mod core;
pub mod embed;
pub mod infer;
pub mod logging;
pub mod openai;
pub mod otel;
pub mod query;
pub mod shm;
pub mod stream;
pub mod trace;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::cache::ResponseCache;
use crate::logging::LogControl;
use crate::models::Registry;

/// The model registry and what it is made of (`wisp-models`).
pub use wisp_models as models;

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

/// The service every front end calls. It is built by [`core::Core::open`]; its state is
/// reached through methods, so a front end cannot change a policy behind the service's back.
pub struct Service {
    /// Loaded models.
    pub(crate) registry: Arc<Registry>,
    /// The response cache (`--cache-config`), if any.
    pub(crate) cache: Option<Arc<ResponseCache>>,
    /// Ready only if every model is ready (`--strict-readiness`).
    pub(crate) strict_readiness: bool,
    /// The models that failed to load at start-up: under strict readiness the server is not
    /// ready while one of them stays loaded and not ready (Triton would have exited). A model
    /// that fails a later load, or a load request's upload, does not change readiness, as in
    /// Triton, where only live (ready) versions count.
    pub(crate) startup_failures: Vec<String>,
    /// Model control mode (load/unload allowed only in explicit mode).
    pub(crate) control_mode: ControlMode,
    /// Which network front ends may load and unload in explicit mode.
    pub(crate) network_control: control::NetworkControl,
    /// `--require-signed-models`: a load request may not replace a model's (signed) config.
    pub(crate) signed_only: bool,
    /// Logging settings (logging extension).
    pub(crate) logging: LogControl,
    /// The in-flight request memory budget in KiB (`--max-inflight-bytes`), shared by both
    /// protocols.
    pub(crate) budget: Arc<tokio::sync::Semaphore>,
    /// Registered system shared memory regions (the shared memory extension).
    pub(crate) shm: shm::SharedMemory,
    /// Trace settings and finished traces (the trace extension).
    pub(crate) trace: trace::TraceControl,
    /// Repositories mirrored from elsewhere (object storage), whose copies an explicit load
    /// brings up to date first.
    pub(crate) remotes: Vec<Arc<dyn RepositorySource>>,
}

impl Service {
    /// The model registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The in-flight request memory budget in KiB (`--max-inflight-bytes`), which both
    /// protocols charge a request's bytes to as they arrive ([`Charge`]).
    pub fn budget(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.budget
    }

    /// Registered system shared memory regions (the shared memory extension).
    pub fn shm(&self) -> &shm::SharedMemory {
        &self.shm
    }

    /// Trace settings and finished traces (the trace extension).
    pub fn trace(&self) -> &trace::TraceControl {
        &self.trace
    }

    /// The logging settings (the logging extension).
    pub fn logging(&self) -> &LogControl {
        &self.logging
    }
}

/// A model repository whose files live elsewhere (an object store) and are mirrored into the
/// local directory the registry loads from. An explicit load brings the model's mirrored copy
/// up to date first, as Triton fetches a cloud model on load.
pub trait RepositorySource: Send + Sync {
    /// Brings `model`'s mirrored copy up to date. A failure is the source's to log: the
    /// mirrored copy then loads as it is.
    fn sync_model<'a>(&'a self, model: &'a str) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

    /// Brings every model's mirrored copy up to date (poll mode, before each poll). A failure
    /// is the source's to log: the registry then polls what was mirrored.
    fn sync_all(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// How models are loaded and changed at run time (Triton's `--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlMode {
    /// Load every model at start-up; the load/unload APIs are refused.
    None,
    /// Load every model at start-up, then follow repository changes every
    /// `--repository-poll-secs`; the load/unload APIs are refused.
    Poll,
    /// Load only `--load-model` models at start-up; the load/unload APIs change models.
    Explicit,
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

    /// What is charged, in bytes (whole KiB).
    pub fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
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
