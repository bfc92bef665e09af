//! Triton's sequence batcher, in front of a [`Scheduler`]: requests carrying a correlation ID
//! form sequences of a stateful model.
//!
//! - A sequence starts with a request flagged START; a request for an unknown sequence without
//!   it is refused. One flagged END releases it, and so does `max_sequence_idle_microseconds`
//!   without a request.
//! - Each sequence holds a slot of one instance for its lifetime (`direct`: `max_batch_size`
//!   slots per instance; `oldest`: `max_candidate_sequences`). Its requests run on that
//!   instance only, one at a time and in order; requests of different sequences on the same
//!   instance batch together. A sequence that finds no free slot waits in a backlog, in
//!   arrival order, until one is released. Slots are cut so that the implicit state of all
//!   slot holders stays within `MAX_STATE_BYTES_TOTAL`.
//! - The batcher adds the control inputs the config names (START, END, READY, CORRID) and the
//!   implicit state: the model's state output after one request is its state input in the
//!   next, zeros on START. State outputs are not returned to the client unless the config
//!   lists them as outputs.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use wisp_core::config::bounds::{MAX_SEQUENCES, MAX_STATE_BYTES_TOTAL};
use wisp_core::config::sequence::{ControlKind, SequenceBatching};
use wisp_core::infer::{CorrelationId, SequenceFlags};
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

use crate::{Responder, Scheduler};

/// Requests one sequence may have waiting behind the one it is running.
pub const MAX_PENDING_PER_SEQUENCE: usize = 64;

struct Pending {
    request: InferRequest,
    respond: Responder,
    flags: SequenceFlags,
}

struct Sequence {
    /// The instance whose slot it holds (`None`: in the backlog).
    instance: Option<usize>,
    /// Implicit state, as the next request's inputs.
    state: Vec<Tensor>,
    queue: VecDeque<Pending>,
    /// A request of it is with the scheduler.
    busy: bool,
    /// It saw END: the next request must START it again.
    ended: bool,
    last: Instant,
}

#[derive(Default)]
struct Inner {
    live: HashMap<CorrelationId, Sequence>,
    /// Slots in use per instance.
    used: Vec<usize>,
    /// Sequences waiting for a slot, oldest first.
    backlog: VecDeque<CorrelationId>,
    next_sweep: Option<Instant>,
}

/// What to do once the lock is released.
#[derive(Default)]
struct Actions {
    send: Vec<(CorrelationId, usize, InferRequest, Responder, bool)>,
    fail: Vec<(Responder, Error)>,
}

/// The sequence batcher of one model version.
pub struct Sequencer {
    model: String,
    spec: SequenceBatching,
    batching: bool,
    slots: usize,
    /// Outputs the client may see: state outputs not among them are kept back.
    public_outputs: Vec<String>,
    scheduler: Weak<Scheduler>,
    inner: Mutex<Inner>,
    /// Slots in use per instance, as the scheduler's batcher reads them.
    demand: Arc<Vec<AtomicUsize>>,
}

impl Sequencer {
    /// The batcher for `model` (`max_batch_size` as configured) in front of `scheduler`, which
    /// runs `instances` instances. `public_outputs` are the outputs the config lists.
    pub fn new(
        model: &str,
        spec: SequenceBatching,
        max_batch_size: i32,
        public_outputs: Vec<String>,
        scheduler: &Arc<Scheduler>,
        instances: usize,
    ) -> Arc<Self> {
        let instances = instances.max(1);
        // The state of every slot holder together stays within its bound.
        let state_bytes: u64 = spec
            .states
            .iter()
            .map(|s| {
                let elems = s.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
                elems.saturating_mul(s.datatype.size().unwrap_or(1) as u64)
            })
            .fold(0u64, u64::saturating_add);
        let by_state = MAX_STATE_BYTES_TOTAL
            .checked_div(state_bytes)
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let slots = spec
            .slots_per_instance(max_batch_size)
            .min(MAX_SEQUENCES.div_ceil(instances))
            .min((by_state / instances).max(1));
        let demand: Arc<Vec<AtomicUsize>> =
            Arc::new((0..instances).map(|_| AtomicUsize::new(0)).collect());
        scheduler.set_instance_demand(demand.clone());
        Arc::new(Sequencer {
            demand,
            model: model.to_string(),
            slots,
            spec,
            batching: max_batch_size > 0,
            public_outputs,
            scheduler: Arc::downgrade(scheduler),
            inner: Mutex::new(Inner {
                used: vec![0; instances],
                ..Default::default()
            }),
        })
    }

    /// Sequences live now (holding a slot or waiting for one).
    pub fn live(&self) -> usize {
        self.inner.lock().expect("sequencer lock").live.len()
    }

    /// Queues `request` on its sequence; `respond` gets its outcome. Fails at once, without
    /// calling `respond`, for a request without a correlation ID, one that continues a sequence
    /// that is not live, or when too many sequences or requests wait.
    pub fn enqueue(self: &Arc<Self>, request: InferRequest, respond: Responder) -> Result<()> {
        let Some(flags) = request.sequence.clone() else {
            return Err(Error::invalid(format!(
                "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
                self.model
            )));
        };
        if self.batching && request.batch_size(true) != 1 {
            return Err(Error::invalid(format!(
                "inference request for sequence {} to model '{}' must have batch size 1, got {}",
                flags.id,
                self.model,
                request.batch_size(true)
            )));
        }
        let now = Instant::now();
        let actions = {
            let mut inner = self.inner.lock().expect("sequencer lock");
            let mut actions = self.sweep(&mut inner, now);
            if !inner.live.contains_key(&flags.id) {
                if !flags.start {
                    drop(inner);
                    self.run(actions);
                    return Err(self.missing_start(&flags.id));
                }
                if inner.live.len() >= MAX_SEQUENCES {
                    drop(inner);
                    self.run(actions);
                    return Err(Error::unavailable(format!(
                        "model '{}' already holds {MAX_SEQUENCES} sequences",
                        self.model
                    )));
                }
                inner.live.insert(
                    flags.id.clone(),
                    Sequence {
                        instance: None,
                        state: Vec::new(),
                        queue: VecDeque::new(),
                        busy: false,
                        ended: false,
                        last: now,
                    },
                );
                self.assign(&mut inner, &flags.id);
            }
            let seq = inner.live.get_mut(&flags.id).expect("inserted above");
            if seq.queue.len() >= MAX_PENDING_PER_SEQUENCE {
                drop(inner);
                // the sweep may have given a freed slot to a waiting sequence: send its request
                self.run(actions);
                return Err(Error::unavailable(format!(
                    "sequence {} of model '{}' already has {MAX_PENDING_PER_SEQUENCE} requests waiting",
                    flags.id, self.model
                )));
            }
            let id = flags.id.clone();
            seq.queue.push_back(Pending {
                request,
                respond,
                flags,
            });
            seq.last = now;
            self.take_next(&mut inner, &id, &mut actions);
            actions
        };
        self.run(actions);
        Ok(())
    }

    fn missing_start(&self, id: &CorrelationId) -> Error {
        Error::invalid(format!(
            "inference request for sequence {id} to model '{}' must specify the START flag on the first request of the sequence",
            self.model
        ))
    }

    /// Gives sequence `id` a slot on the least used instance, or puts it in the backlog.
    fn assign(&self, inner: &mut Inner, id: &CorrelationId) {
        let free = (0..inner.used.len())
            .filter(|&i| inner.used[i] < self.slots)
            .min_by_key(|&i| inner.used[i]);
        match free {
            Some(i) => {
                inner.used[i] += 1;
                self.demand[i].store(inner.used[i], Ordering::Relaxed);
                if let Some(s) = inner.live.get_mut(id) {
                    s.instance = Some(i);
                }
            }
            None => inner.backlog.push_back(id.clone()),
        }
    }

    /// Ends sequence `id`: its slot goes to the oldest sequence of the backlog.
    fn release(&self, inner: &mut Inner, id: &CorrelationId, actions: &mut Actions) {
        let Some(seq) = inner.live.remove(id) else {
            return;
        };
        for p in seq.queue {
            actions.fail.push((
                p.respond,
                Error::unavailable(format!(
                    "sequence {id} of model '{}' was released",
                    self.model
                )),
            ));
        }
        inner.backlog.retain(|b| b != id);
        let Some(i) = seq.instance else {
            return;
        };
        inner.used[i] -= 1;
        while let Some(next) = inner.backlog.pop_front() {
            if let Some(s) = inner.live.get_mut(&next) {
                s.instance = Some(i);
                inner.used[i] += 1;
                self.take_next(inner, &next, actions);
                break;
            }
        }
        self.demand[i].store(inner.used[i], Ordering::Relaxed);
    }

    /// Releases the sequences idle for longer than `max_sequence_idle_microseconds` (checked
    /// at most a few times per idle period).
    fn sweep(&self, inner: &mut Inner, now: Instant) -> Actions {
        let mut actions = Actions::default();
        if inner.next_sweep.is_some_and(|t| now < t) {
            return actions;
        }
        inner.next_sweep = Some(now + self.spec.idle / 4);
        let idle: Vec<CorrelationId> = inner
            .live
            .iter()
            .filter(|(_, s)| {
                !s.busy && s.queue.is_empty() && now.duration_since(s.last) > self.spec.idle
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            tracing::debug!(model = %self.model, sequence = %id, "sequence idle; released");
            self.release(inner, &id, &mut actions);
        }
        actions
    }

    /// If sequence `id` holds a slot and is not running a request, takes its next request and
    /// prepares it (controls, state).
    fn take_next(&self, inner: &mut Inner, id: &CorrelationId, actions: &mut Actions) {
        loop {
            let Some(seq) = inner.live.get_mut(id) else {
                return;
            };
            let Some(instance) = seq.instance.filter(|_| !seq.busy) else {
                return;
            };
            let Some(Pending {
                mut request,
                respond,
                flags,
            }) = seq.queue.pop_front()
            else {
                if seq.ended {
                    self.release(inner, id, actions);
                }
                return;
            };
            if seq.ended && !flags.start {
                actions.fail.push((respond, self.missing_start(id)));
                continue;
            }
            if flags.start {
                seq.ended = false;
                seq.state = self.initial_state();
            }
            match self.controls(&flags) {
                Ok(controls) => request.inputs.extend(controls),
                Err(e) => {
                    actions.fail.push((respond, e));
                    continue;
                }
            }
            request.inputs.extend(seq.state.iter().cloned());
            seq.busy = true;
            actions
                .send
                .push((id.clone(), instance, request, respond, flags.end));
            return;
        }
    }

    fn initial_state(&self) -> Vec<Tensor> {
        self.spec
            .states
            .iter()
            .map(|s| {
                let shape: Vec<i64> = self
                    .batching
                    .then_some(1)
                    .into_iter()
                    .chain(s.dims.iter().copied())
                    .collect();
                let count: usize = s.dims.iter().map(|&d| d as usize).product();
                let size = s.datatype.size().unwrap_or(1);
                Tensor::new(
                    s.input_name.clone(),
                    s.datatype,
                    shape,
                    vec![0u8; count * size].into(),
                )
                .expect("the config's state dims were bounded when it was validated")
            })
            .collect()
    }

    /// The control tensors for a request with `flags`.
    fn controls(&self, flags: &SequenceFlags) -> Result<Vec<Tensor>> {
        let shape = if self.batching { vec![1, 1] } else { vec![1] };
        let mut out = Vec::with_capacity(self.spec.controls.len());
        for c in &self.spec.controls {
            let data: Vec<u8> = match (c.kind, &c.false_true) {
                (ControlKind::CorrId, _) => self.corrid(&flags.id, c.datatype)?,
                (kind, Some((f, t))) => {
                    let on = match kind {
                        ControlKind::Start => flags.start,
                        ControlKind::End => flags.end,
                        _ => true,
                    };
                    if on {
                        t.clone()
                    } else {
                        f.clone()
                    }
                }
                (_, None) => continue,
            };
            out.push(Tensor::new(
                c.name.clone(),
                c.datatype,
                shape.clone(),
                data.into(),
            )?);
        }
        Ok(out)
    }

    fn corrid(&self, id: &CorrelationId, dt: DataType) -> Result<Vec<u8>> {
        let wrong = || {
            Error::invalid(format!(
                "model '{}' takes {} correlation IDs; sequence {id} does not fit",
                self.model,
                dt.as_str()
            ))
        };
        Ok(match (id, dt) {
            (CorrelationId::Number(n), DataType::Uint64) => n.to_le_bytes().to_vec(),
            (CorrelationId::Number(n), DataType::Int64) => i64::try_from(*n)
                .map_err(|_| wrong())?
                .to_le_bytes()
                .to_vec(),
            (CorrelationId::Number(n), DataType::Uint32) => u32::try_from(*n)
                .map_err(|_| wrong())?
                .to_le_bytes()
                .to_vec(),
            (CorrelationId::Number(n), DataType::Int32) => i32::try_from(*n)
                .map_err(|_| wrong())?
                .to_le_bytes()
                .to_vec(),
            (CorrelationId::Number(n), DataType::Bytes) => {
                encode_bytes_elements([n.to_string().as_bytes()])
            }
            (CorrelationId::Text(s), DataType::Bytes) => encode_bytes_elements([s.as_bytes()]),
            _ => return Err(wrong()),
        })
    }

    /// Sends prepared requests to the scheduler and answers failed ones.
    fn run(self: &Arc<Self>, mut actions: Actions) {
        while !actions.send.is_empty() || !actions.fail.is_empty() {
            for (respond, e) in std::mem::take(&mut actions.fail) {
                respond(Err(e));
            }
            for (id, instance, request, respond, end) in std::mem::take(&mut actions.send) {
                let slot = Arc::new(Mutex::new(Some(respond)));
                let me = self.clone();
                let (held, done_id) = (slot.clone(), id.clone());
                let callback: Responder = Box::new(move |r| {
                    if let Some(respond) = held.lock().expect("responder").take() {
                        me.completed(&done_id, end, respond, r);
                    }
                });
                let sent = match self.scheduler.upgrade() {
                    Some(s) => s.enqueue_on(request, callback, Some(instance)),
                    None => Err(Error::unavailable(format!(
                        "model '{}' is unloading",
                        self.model
                    ))),
                };
                if let Err(e) = sent {
                    if let Some(respond) = slot.lock().expect("responder").take() {
                        let more = self.finish(&id, end, Err(e), respond);
                        actions.send.extend(more.send);
                        actions.fail.extend(more.fail);
                    }
                }
            }
        }
    }

    /// A request of sequence `id` finished: keep its state, answer it, send the next one.
    fn completed(
        self: &Arc<Self>,
        id: &CorrelationId,
        end: bool,
        respond: Responder,
        result: Result<InferResponse>,
    ) {
        let actions = self.finish(id, end, result, respond);
        self.run(actions);
    }

    fn finish(
        &self,
        id: &CorrelationId,
        end: bool,
        mut result: Result<InferResponse>,
        respond: Responder,
    ) -> Actions {
        let mut actions = Actions::default();
        {
            let mut inner = self.inner.lock().expect("sequencer lock");
            if let Some(seq) = inner.live.get_mut(id) {
                seq.busy = false;
                seq.last = Instant::now();
                if let Ok(response) = &mut result {
                    for s in &self.spec.states {
                        let Some(i) = response
                            .outputs
                            .iter()
                            .position(|t| t.name == s.output_name)
                        else {
                            continue;
                        };
                        let mut t = if self.public_outputs.contains(&s.output_name) {
                            response.outputs[i].clone()
                        } else {
                            response.outputs.remove(i)
                        };
                        t.name = s.input_name.clone();
                        match seq.state.iter_mut().find(|x| x.name == s.input_name) {
                            Some(old) => *old = t,
                            None => seq.state.push(t),
                        }
                    }
                }
                if end {
                    seq.ended = true;
                }
                self.take_next(&mut inner, id, &mut actions);
            }
        }
        respond(result);
        actions
    }
}

#[cfg(test)]
mod tests;
