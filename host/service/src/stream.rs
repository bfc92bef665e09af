//! Decoupled models (Triton's `model_transaction_policy { decoupled: true }`): a request gets
//! zero or more responses, then a final flag. [`Service::infer_stream`] runs such a request and
//! passes each response, as an [`Answer`], to the front end's channel as the model sends it
//! (gRPC `ModelStreamInfer`, HTTP `generate_stream`).
//!
//! A model never waits for its client: each response is charged to the in-flight memory
//! budget and queued at once, so an instance (and every request batched with it) goes on as
//! soon as the model has sent. The queue is bounded ([`STREAM_BUFFER`] responses): a send that
//! finds it full, or the budget spent, fails, and so does the request. A client that stops
//! reading is cut off by its connection's `--stream-write-timeout`, which closes the channel;
//! the model sees a closed channel as cancellation, and what was queued for the client is
//! released with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use wisp_core::infer::{ResponseSink, StreamedResponse};
use wisp_core::{Error, InferResponse, Result};

use super::infer::{produced_outputs, select_outputs, Answer, Decoded, OutputSpec, Prepared};
use super::Service;
use crate::models::ModelVersion;

/// Responses a stream holds for its client; a send past it fails the request.
pub const STREAM_BUFFER: usize = 512;

/// How long the last part may wait for room once the model has finished.
const FINAL_WAIT: Duration = Duration::from_secs(10);

/// One message of a decoupled request's stream.
pub struct Part {
    /// A response (or an error in its place); `None` on a final part that carries only the
    /// flag.
    pub answer: Option<Result<Answer>>,
    /// Whether this is the request's last part.
    pub last: bool,
    /// The in-flight budget this part's memory is charged to, until the front end has
    /// handed it to its connection (dropped with it).
    pub held: Option<crate::Charge>,
}

/// The sink a decoupled model's responses go through: converts each into an [`Answer`] for
/// the front end and queues it, waiting for room at most until the model's deadline.
struct ChannelSink {
    tx: mpsc::Sender<Part>,
    model: Arc<ModelVersion>,
    /// The outputs the client named; empty: every output each response holds.
    wanted: Vec<OutputSpec>,
    id: String,
    binary_default: bool,
    /// The final part went through: the service sends no other.
    finished: AtomicBool,
    /// The in-flight budget each queued response is charged to.
    budget: Arc<tokio::sync::Semaphore>,
    /// When the request arrived, and whether a part has been queued since: the time to the
    /// first is the model's `nv_inference_first_response_histogram_ms`.
    received: Instant,
    sent_any: AtomicBool,
}

impl std::fmt::Debug for ChannelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSink")
            .field("model", &self.model.name)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ChannelSink {
    /// Notes that a part was queued: the first one is the model's time to first response.
    fn sent_part(&self) {
        if !self.sent_any.swap(true, Ordering::Relaxed) {
            if let Some(h) = &self.model.first_response {
                h.observe(self.received.elapsed());
            }
        }
    }

    fn answer(&self, response: InferResponse) -> Result<Answer> {
        let labels = |name: &str| self.model.labels.get(name).cloned();
        let wanted = if self.wanted.is_empty() {
            produced_outputs(&self.model.config, &response)
        } else {
            self.wanted.clone()
        };
        let tensors = select_outputs(response, &wanted, &self.model.config, &labels)?;
        Ok(Answer {
            model: Arc::clone(&self.model),
            id: self.id.clone(),
            outputs: wanted.into_iter().zip(tensors).collect(),
            binary_default: self.binary_default,
        })
    }
}

impl ResponseSink for ChannelSink {
    fn send(&self, part: StreamedResponse, _deadline: Instant) -> Result<()> {
        if self.finished.load(Ordering::SeqCst) {
            return Err(Error::invalid(
                "the request's final response was sent already",
            ));
        }
        if self.tx.is_closed() {
            return Err(Error::unavailable(
                "the client has gone: its stream is closed",
            ));
        }
        let last = part.last;
        let answer = part.response.map(|r| r.and_then(|r| self.answer(r)));
        let bytes = match &answer {
            Some(Ok(a)) => a.outputs.iter().map(|(_, t)| t.data.len() as u64).sum(),
            _ => 0,
        };
        let mut held = crate::Charge::new(&self.budget);
        held.grow_to(bytes).map_err(|_| {
            Error::exhausted(
                "the server is at its in-flight request memory budget (--max-inflight-bytes): \
                 the response cannot be held for the client",
            )
        })?;
        let part = Part {
            answer,
            last,
            held: Some(held),
        };
        match self.tx.try_send(part) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(Error::unavailable(
                    "the client has gone: its stream is closed",
                ))
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(Error::unavailable(format!(
                    "the client has not read its last {STREAM_BUFFER} responses"
                )))
            }
        }
        self.sent_part();
        if last {
            self.finished.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl Service {
    /// Runs `decoded` on the decoupled model `m`, sending each of its responses to `tx` as the
    /// model produces it and ending with a part whose `last` is set (an error in its place if
    /// the request fails before or while running). What the model returns from its execution
    /// becomes the last part when it did not send one itself: its outputs, or the flag alone.
    pub async fn infer_stream(
        &self,
        m: Arc<ModelVersion>,
        decoded: Result<Decoded>,
        received: Instant,
        trace_parent: Option<wisp_core::trace::TraceParent>,
        tx: mpsc::Sender<Part>,
    ) {
        let fail = |e: Error| Part {
            answer: Some(Err(e)),
            last: true,
            held: None,
        };
        if !m.config.decoupled() {
            let _ = tx
                .send(fail(Error::internal(format!(
                    "model '{}' is not decoupled: it takes one response per request",
                    m.name
                ))))
                .await;
            return;
        }
        let prepared = self.prepare(&m, decoded, received, trace_parent).await;
        let Prepared {
            mut request,
            outputs,
            binary_default,
            _shm_permit,
            ..
        } = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(fail(e)).await;
                return;
            }
        };
        if let Some(o) = outputs.iter().find(|o| o.shm.is_some()) {
            let _ = tx
                .send(fail(Error::invalid(format!(
                    "output '{}': a decoupled model's outputs cannot be written to shared memory",
                    o.name
                ))))
                .await;
            return;
        }
        let sink = Arc::new(ChannelSink {
            tx: tx.clone(),
            model: Arc::clone(&m),
            wanted: outputs,
            id: request.id.clone(),
            binary_default,
            finished: AtomicBool::new(false),
            budget: self.budget.clone(),
            received,
            sent_any: AtomicBool::new(false),
        });
        request.responses = Some(sink.clone() as Arc<dyn ResponseSink>);
        let trace = request.trace.clone();
        let response = m.infer(request).await;
        if let Some(t) = trace {
            t.mark("REQUEST_END");
            self.trace.finish(&t);
        }
        if sink.finished.load(Ordering::SeqCst) {
            return;
        }
        let part = match response {
            Ok(r) if r.outputs.is_empty() => Part {
                answer: None,
                last: true,
                held: None,
            },
            Ok(r) => Part {
                answer: Some(sink.answer(r)),
                last: true,
                held: None,
            },
            Err(e) => fail(e),
        };
        // A client that stopped reading does not hold the request (and its budget) forever.
        if let Ok(Ok(())) = tokio::time::timeout(FINAL_WAIT, tx.send(part)).await {
            sink.sent_part();
        }
    }
}
