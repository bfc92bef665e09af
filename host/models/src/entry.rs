//! What a loaded model is: a version behind its scheduler, a model's versions, an index row.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use wisp_core::backend::LoadedModel;
use wisp_core::config::{ModelConfig, Signature};
use wisp_core::{Error, InferRequest, InferResponse, Result};
use wisp_scheduler::sequence::Sequencer;
use wisp_scheduler::{ModelStats, Responder, Scheduler};

/// One loaded, ready model version.
pub struct ModelVersion {
    /// Model name.
    pub name: String,
    /// Version number.
    pub version: u64,
    /// The normalized, auto-completed, validated config.
    pub config: Arc<ModelConfig>,
    /// Its inputs and outputs, typed: what requests are checked against.
    pub signature: Arc<Signature>,
    /// Labels per output name (from `label_filename`).
    pub labels: HashMap<String, Arc<Vec<String>>>,
    /// The engine that runs it.
    pub engine: String,
    /// Seconds it took to load (and warm up).
    pub load_secs: f64,
    /// When it became ready (wall clock).
    pub loaded_at: std::time::SystemTime,
    /// For an ensemble, the models its steps call, with the version each asks for (read from
    /// the config once, at load).
    pub composing: Vec<(String, Option<u64>)>,
    /// The parameters Wisp reads from its config, typed (among them the SLA that guards a
    /// reload bringing it in, and its embeddings API mapping).
    pub params: Arc<wisp_core::config::params::Params>,
    /// Time to first response, for a decoupled model (Triton's
    /// `nv_inference_first_response_histogram_ms`, buckets from its `model_metrics`).
    pub first_response: Option<Arc<super::first_response::FirstResponse>>,
    /// What its gate measured against the version it replaced, when it passed one.
    pub gate: Option<Arc<super::gate::Report>>,
    /// What it has served, for judging its SLA (present when it declares one).
    pub(super) probe: Option<Arc<super::rollout::Probe>>,
    pub(super) scheduler: Arc<Scheduler>,
    /// The sequence batcher in front of the scheduler, for a stateful model.
    pub(super) sequencer: Option<Arc<Sequencer>>,
    pub(super) loaded: Arc<dyn LoadedModel>,
}

impl ModelVersion {
    /// Runs one request through the scheduler and waits for its response without blocking the
    /// async runtime.
    /// A short request to an idle model may run on the calling worker
    /// ([`Scheduler::enqueue_or_run`]).
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue_or_run(
            request,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.await.map_err(|_| {
            Error::internal(format!(
                "model '{}' dropped the request without answering",
                self.name
            ))
        })?
    }

    /// Queues one request; `respond` is called once with its outcome.
    pub fn submit(&self, request: InferRequest, respond: Responder) -> Result<()> {
        self.enqueue(request, respond)
    }

    /// To the sequence batcher for a stateful model, else straight to the scheduler.
    fn enqueue(&self, request: InferRequest, respond: Responder) -> Result<()> {
        match &self.sequencer {
            Some(s) => s.enqueue(request, respond),
            None => self.scheduler.enqueue(request, respond),
        }
    }

    /// As `enqueue`, but a stateless model's short request may run on this thread when its
    /// instance is idle: for callers that wait for the answer anyway, with a `respond` that
    /// only hands the answer over.
    fn enqueue_or_run(&self, request: InferRequest, respond: Responder) -> Result<()> {
        match &self.sequencer {
            Some(s) => s.enqueue(request, respond),
            None => self.scheduler.enqueue_or_run_in(request, respond, &lend),
        }
    }

    /// Runs one request through the scheduler from a thread that may block (a plugin's
    /// wasi-nn call), waiting at most until `deadline`.
    pub fn infer_blocking(
        &self,
        request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.enqueue_or_run(
            request,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::unavailable(format!(
                "model '{}' did not answer before the caller's deadline",
                self.name
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::internal(format!(
                "model '{}' dropped the request without answering",
                self.name
            ))),
        }
    }

    /// Runs `requests` through the scheduler all at once (so that they batch), from a thread
    /// that may block, waiting at most until `deadline`: one result per request, in order.
    /// `Err` entries of `requests` are passed through without running.
    pub fn infer_many_blocking(
        &self,
        requests: Vec<Result<InferRequest>>,
        deadline: Instant,
    ) -> Vec<Result<InferResponse>> {
        let n = requests.len();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut results: Vec<Option<Result<InferResponse>>> = Vec::with_capacity(n);
        let mut waiting = 0;
        for (i, r) in requests.into_iter().enumerate() {
            let queued = r.and_then(|request| {
                let tx = tx.clone();
                self.enqueue(
                    request,
                    Box::new(move |r| {
                        let _ = tx.send((i, r));
                    }),
                )
            });
            match queued {
                Ok(()) => {
                    waiting += 1;
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        drop(tx);
        while waiting > 0 {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((i, r)) => {
                    results[i] = Some(r);
                    waiting -= 1;
                }
                Err(_) => break,
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::unavailable(format!(
                        "model '{}' did not answer before the caller's deadline",
                        self.name
                    )))
                })
            })
            .collect()
    }

    /// The version's statistics.
    pub fn stats(&self) -> &Arc<ModelStats> {
        self.scheduler.stats()
    }

    /// For an ensemble, per step: its model and how many requests skipped it (a required
    /// input was not produced). Empty for other models.
    pub fn step_skips(&self) -> Vec<(String, u64)> {
        self.loaded.step_skips()
    }

    /// Requests queued, not yet executing.
    pub fn pending(&self) -> usize {
        self.scheduler.pending()
    }

    /// Stops the scheduler after it drains its queue (blocking). Dropping the last reference
    /// does the same.
    pub(super) fn stop(&self) {
        self.scheduler.stop();
    }
}

/// A version's state.
#[derive(Clone)]
pub enum VersionState {
    /// Serving.
    Ready(Arc<ModelVersion>),
    /// Failed to load, with the reason.
    Unavailable(String),
}

/// A model and its versions.
#[derive(Clone)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// Versions selected by the version policy.
    pub versions: BTreeMap<u64, VersionState>,
    /// Why the whole model failed (bad config, no versions...), if it did.
    pub error: Option<String>,
    /// The versions this load judged by their gate, passed or not.
    pub gated: Vec<super::gate::Outcome>,
}

impl ModelEntry {
    pub(super) fn broken(name: &str, reason: impl std::fmt::Display) -> Self {
        ModelEntry {
            name: name.to_string(),
            versions: BTreeMap::new(),
            error: Some(reason.to_string()),
            gated: Vec::new(),
        }
    }

    /// The model is ready when it has at least one ready version and no model-level error.
    pub fn is_ready(&self) -> bool {
        self.error.is_none()
            && self
                .versions
                .values()
                .any(|v| matches!(v, VersionState::Ready(_)))
    }

    /// The models the ready versions of an ensemble compose (empty for other models).
    pub fn composing(&self) -> std::collections::BTreeSet<String> {
        self.versions
            .values()
            .filter_map(|v| match v {
                VersionState::Ready(m) => Some(m.composing.iter().map(|(name, _)| name.clone())),
                VersionState::Unavailable(_) => None,
            })
            .flatten()
            .collect()
    }

    /// Why the model is not ready.
    pub fn reason(&self) -> String {
        if let Some(e) = &self.error {
            return e.clone();
        }
        let reasons: Vec<String> = self
            .versions
            .iter()
            .filter_map(|(v, s)| match s {
                VersionState::Unavailable(r) => Some(format!("version {v}: {r}")),
                VersionState::Ready(_) => None,
            })
            .collect();
        reasons.join("; ")
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, when the row is about one.
    pub version: Option<u64>,
    /// `READY`, `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is not ready (or why its last reload failed while it keeps serving).
    pub reason: String,
}

/// A permit to run a call that may take long (a plugin's) on this thread: on a worker of a
/// multi-thread tokio runtime, granted to at most all but one of its workers at once, so that
/// however long such calls run, one worker stays free for health checks and other connections
/// (`tokio::task::block_in_place` would move the worker's tasks away instead, but costs as much
/// as the hand-off to the instance's thread it saves); on any other thread (a plugin's calling
/// a model, a test) always, on a current-thread runtime never.
fn lend() -> Option<Box<dyn std::any::Any>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::runtime::{Handle, RuntimeFlavor};
    static LENT: AtomicUsize = AtomicUsize::new(0);
    struct Lent;
    impl Drop for Lent {
        fn drop(&mut self) {
            LENT.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let Ok(h) = Handle::try_current() else {
        return Some(Box::new(()));
    };
    if h.runtime_flavor() != RuntimeFlavor::MultiThread {
        return None;
    }
    let most = h.metrics().num_workers().saturating_sub(1);
    LENT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < most).then_some(n + 1)
    })
    .ok()
    .map(|_| Box::new(Lent) as Box<dyn std::any::Any>)
}
