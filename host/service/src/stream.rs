//! Decoupled models (Triton's `model_transaction_policy { decoupled: true }`): a request gets
//! zero or more responses, then a final flag. [`Service::infer_stream`] runs such a request and
//! passes each response, as an [`Answer`], to the front end's channel as the model sends it
//! (gRPC `ModelStreamInfer`, HTTP `generate_stream`).
//!
//! The channel is bounded: a model that sends faster than its client reads waits, up to its
//! execution deadline, then its send fails ("did not read"), so a client that stops reading
//! costs one bounded channel and one instance for at most that long. A client that goes away
//! closes the channel, which the model sees as cancellation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use wisp_core::infer::{ResponseSink, StreamedResponse};
use wisp_core::{Error, InferResponse, Result};

use super::infer::{all_outputs, select_outputs, Answer, Decoded, OutputSpec, Prepared};
use super::Service;
use crate::models::ModelVersion;

/// Responses a stream holds for its client before the model has to wait.
pub const STREAM_BUFFER: usize = 16;

/// How long the last part may wait for room once the model has finished.
const FINAL_WAIT: Duration = Duration::from_secs(10);

/// One message of a decoupled request's stream.
pub struct Part {
    /// A response (or an error in its place); `None` on a final part that carries only the
    /// flag.
    pub answer: Option<Result<Answer>>,
    /// Whether this is the request's last part.
    pub last: bool,
}

/// The sink a decoupled model's responses go through: converts each into an [`Answer`] for
/// the front end and queues it, waiting for room at most until the model's deadline.
struct ChannelSink {
    tx: mpsc::Sender<Part>,
    model: Arc<ModelVersion>,
    wanted: Vec<OutputSpec>,
    id: String,
    binary_default: bool,
    /// The final part went through: the service sends no other.
    finished: AtomicBool,
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
    fn answer(&self, response: InferResponse) -> Result<Answer> {
        let labels = |name: &str| self.model.labels.get(name).cloned();
        let tensors = select_outputs(response, &self.wanted, &self.model.config, &labels)?;
        Ok(Answer {
            model: Arc::clone(&self.model),
            id: self.id.clone(),
            outputs: self.wanted.iter().cloned().zip(tensors).collect(),
            binary_default: self.binary_default,
        })
    }
}

impl ResponseSink for ChannelSink {
    fn send(&self, part: StreamedResponse, deadline: Instant) -> Result<()> {
        if self.finished.load(Ordering::SeqCst) {
            return Err(Error::invalid(
                "the request's final response was sent already",
            ));
        }
        let last = part.last;
        let answer = part.response.map(|r| r.and_then(|r| self.answer(r)));
        let mut part = Part {
            answer,
            last: part.last,
        };
        let mut pause = Duration::from_micros(200);
        loop {
            match self.tx.try_send(part) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(Error::unavailable(
                        "the client has gone: its stream is closed",
                    ))
                }
                Err(mpsc::error::TrySendError::Full(back)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::unavailable(
                            "the client did not read its responses before the model's deadline",
                        ));
                    }
                    part = back;
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
            }
        }
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
        let wanted = if outputs.is_empty() {
            all_outputs(&m.config)
        } else {
            outputs
        };
        let sink = Arc::new(ChannelSink {
            tx: tx.clone(),
            model: Arc::clone(&m),
            wanted,
            id: request.id.clone(),
            binary_default,
            finished: AtomicBool::new(false),
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
            },
            Ok(r) => Part {
                answer: Some(sink.answer(r)),
                last: true,
            },
            Err(e) => fail(e),
        };
        // A client that stopped reading does not hold the request (and its budget) forever.
        let _ = tokio::time::timeout(FINAL_WAIT, tx.send(part)).await;
    }
}
