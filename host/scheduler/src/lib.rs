//! `wisp-scheduler`: the per-model-version queue between front ends and backend instances.
//!
//! The contract is three verbs, as in Triton's scheduler: [`Scheduler::enqueue`] a request with
//! a callback for its response, read the [`Scheduler::inflight`] count, and [`Scheduler::stop`].
//!
//! Requests wait in per-priority FIFO queues (Triton's `priority_levels`, with each level's
//! queue policy: `max_queue_size` rejects at once when full, timeouts REJECT or DELAY). Each
//! instance runs on its own dedicated OS thread; when free it takes the next batch: with the
//! dynamic batcher on, as many queued requests (highest priority first, FIFO within a level,
//! equal non-batch shapes, looking past at most [`SHAPE_LOOKAHEAD`] requests of other shapes,
//! and no further once it holds every queued request of its shape) as fit in `max_batch_size`
//! rows, sent at once when a preferred or the maximum size is reached, another shape waits, or
//! the oldest has waited `max_queue_delay_microseconds`.
//! A request whose queue timeout passes under REJECT is answered at once, even while every
//! instance is busy (a model with such a policy gets a timeout thread, as Triton's batcher
//! rejects timed-out requests while it waits for a free instance; idle instances leave those
//! deadlines to it and wake only for DELAY deadlines and batch delays).
//! The backend executes the whole batch and returns one response per request, which goes back
//! to that request's callback (in request order with `preserve_ordering`). A panicking backend
//! fails only the requests it was executing; the instance thread keeps serving.

mod dispatch;
pub mod ensemble;
mod policy;
mod queue;
pub mod rate_limit;
pub mod sequence;
mod stats;
mod timeouts;

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::{Error, InferRequest, InferResponse, Result};

pub use policy::{LevelPolicy, Policy, TimeoutAction};
pub use stats::{BatchStat, DurationStat, FailReason, ModelStats};

use dispatch::{run_batch, run_instance};
use queue::{input_elements, passes_after, shape_key, Job, Level, Ordered, Shapes, State};
use timeouts::run_timeouts;

/// Called exactly once with the request's outcome, on an instance thread (or the caller's
/// thread for a request rejected as it is queued, or the timeout thread for one whose queue
/// timeout passed while every instance was busy).
pub type Responder = Box<dyn FnOnce(Result<InferResponse>) + Send>;

/// Per-request timings handed to an [`Observer`] when a request completes.
#[derive(Debug, Clone, Copy)]
pub struct RequestTiming {
    /// It succeeded.
    pub ok: bool,
    /// Enqueue to response.
    pub total: Duration,
    /// Time queued.
    pub queue: Duration,
    /// The batch's compute times.
    pub exec: ExecTiming,
    /// Elements in the request's inputs (its size, so that latencies of like-sized requests
    /// can be compared).
    pub elements: u64,
}

/// Receives every completed request's timings (the server feeds latency summaries with it).
pub type Observer = Arc<dyn Fn(&RequestTiming) + Send + Sync>;

struct Shared {
    model: String,
    policy: Policy,
    state: Mutex<State>,
    ready: Condvar,
    /// Wakes the timeout thread: a REJECT deadline earlier than it knew of, or the end.
    timeouts: Condvar,
    /// A timeout thread answers REJECT deadlines (the policy has them), so idle instances
    /// need not wake for them.
    timeout_thread: bool,
    inflight: AtomicUsize,
    stats: Arc<ModelStats>,
    ordered: Mutex<Ordered>,
    observer: Option<Observer>,
    /// For jobs pinned to instances (sequences): how many requests each instance can be sent
    /// at most at once. A batch that holds that many goes at once: no other can arrive.
    demand: std::sync::OnceLock<Arc<Vec<AtomicUsize>>>,
    /// Under `--rate-limit execution_count`: the resources each instance waits for.
    limits: std::sync::OnceLock<Limits>,
    /// The reference point of `busy` marks.
    epoch: Instant,
    /// A moving average of recent batch execution times, in nanoseconds (0 before the first):
    /// the caller fast path is only for models whose executions are short.
    recent_exec_ns: AtomicU64,
}

/// How many queued requests of other shapes a dynamic batch looks past for more of its own.
/// Requests of its shape further back wait for a later batch. This bounds the work done under
/// the scheduler lock per dispatch when shapes vary from request to request (variable-length
/// inputs), which would otherwise be a scan of the whole queue for every batch.
pub const SHAPE_LOOKAHEAD: usize = 1024;

/// The least time between two of the timeout thread's scans of the queue. When deadlines pass
/// one after another in a deep queue, each scan answers all that have passed, and the queue is
/// scanned at most this often under the lock. A timed-out request is answered at most this late.
const TIMEOUT_SCAN_GAP: Duration = Duration::from_millis(1);

/// Longest recent average execution for which a caller may run a request itself.
const ON_CALLER_MAX_NS: u64 = 100_000;
/// Largest request (input bytes) a caller may run itself: the size above which front ends
/// already move work off their async workers.
const ON_CALLER_MAX_BYTES: usize = 64 * 1024;

/// One instance, shared by the thread started for it and, on the fast path, by a caller.
struct Slot {
    /// `None` once its thread has left (retired or stopped).
    instance: Mutex<Option<Box<dyn Instance>>>,
    /// When it started the batch it is executing, in nanoseconds since `Shared::epoch` plus
    /// one; 0 while it waits (a watchdog reads it: see [`Scheduler::longest_execution`]).
    busy: AtomicU64,
    /// [`Instance::runs_on_caller`], read once.
    on_caller: bool,
    /// [`Instance::may_stall`], read once.
    may_stall: bool,
    /// Its place in start order (which instance group it belongs to).
    index: usize,
    /// Unique in the process: the rate limiter counts each instance's turns by it.
    id: usize,
}

/// Gives every instance ever started its own [`Slot::id`].
static NEXT_SLOT_ID: AtomicUsize = AtomicUsize::new(0);

/// A model's share of the server's rate limiter: what each of its instances needs.
struct Limits {
    limiter: Arc<rate_limit::RateLimiter>,
    /// Per instance in start order; instances added later (a resize) take the last one's.
    needs: Vec<rate_limit::Needs>,
    /// Counts these needs in the pool's totals until the scheduler goes.
    _hold: rate_limit::Hold,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn Instance>>> {
        // Executions run under `catch_unwind`: a poisoned lock only means a panic elsewhere,
        // and the instance itself is still whole.
        self.instance
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A model version's queue and its instance threads.
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    instances: AtomicUsize,
    /// Every instance started, in start order (those whose thread left hold `None`). Replaced
    /// whole when instances are added, so that a request's fast path takes a reference to it
    /// rather than a copy.
    slots: Mutex<Arc<[Arc<Slot>]>>,
    /// The timeout thread, when the policy has REJECT timeouts.
    timeouts: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts one thread per instance, named `wisp-<model>-<n>`.
    pub fn start(
        model: &str,
        policy: Policy,
        instances: Vec<Box<dyn Instance>>,
        observer: Option<Observer>,
    ) -> Result<Self> {
        let levels = (0..policy.levels.len()).map(|_| Level::default()).collect();
        let shapes = Shapes::new(policy.dynamic);
        let rejects_on_time = policy.levels.iter().any(|l| {
            l.action == TimeoutAction::Reject && (l.default_timeout.is_some() || l.allow_override)
        });
        let shared = Arc::new(Shared {
            model: model.to_string(),
            policy,
            state: Mutex::new(State {
                levels,
                shapes,
                stopping: false,
                retiring: 0,
                next_seq: 0,
                queued: 0,
                timeouts_done: false,
            }),
            ready: Condvar::new(),
            timeouts: Condvar::new(),
            timeout_thread: rejects_on_time,
            inflight: AtomicUsize::new(0),
            stats: Arc::new(ModelStats::default()),
            ordered: Mutex::new(Ordered::default()),
            observer,
            demand: std::sync::OnceLock::new(),
            limits: std::sync::OnceLock::new(),
            epoch: Instant::now(),
            recent_exec_ns: AtomicU64::new(0),
        });
        let s = Scheduler {
            shared,
            threads: Mutex::new(Vec::new()),
            instances: AtomicUsize::new(0),
            slots: Mutex::new(Arc::new([])),
            timeouts: Mutex::new(None),
        };
        if rejects_on_time {
            let shared = s.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("wisp-{}-timeouts", s.shared.model))
                .spawn(move || run_timeouts(&shared))
                .map_err(|e| Error::internal(format!("cannot start timeout thread: {e}")))?;
            *s.timeouts.lock().expect("timeouts lock") = Some(handle);
        }
        s.add_instances(instances)?;
        Ok(s)
    }

    /// Adds instances, each on a new thread, serving the same queue (resize up in place).
    pub fn add_instances(&self, instances: Vec<Box<dyn Instance>>) -> Result<()> {
        let mut threads = self.threads.lock().expect("threads lock");
        for instance in instances {
            let shared = self.shared.clone();
            let n = threads.len();
            let slot = Arc::new(Slot {
                on_caller: instance.runs_on_caller(),
                may_stall: instance.may_stall(),
                instance: Mutex::new(Some(instance)),
                busy: AtomicU64::new(0),
                index: n,
                id: NEXT_SLOT_ID.fetch_add(1, Ordering::Relaxed),
            });
            {
                let mut slots = self.slots.lock().expect("slots lock");
                *slots = slots.iter().cloned().chain([slot.clone()]).collect();
            }
            let handle = std::thread::Builder::new()
                .name(format!("wisp-{}-{n}", self.shared.model))
                .spawn(move || {
                    run_instance(&shared, &slot, n);
                    // Dropped here, on its own thread, as before the fast path existed.
                    slot.lock().take();
                })
                .map_err(|e| Error::internal(format!("cannot start instance thread: {e}")))?;
            threads.push(handle);
            self.instances.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Retires `n` instances (resize down in place, keeping at least one): each leaves after
    /// finishing what it is executing.
    pub fn retire_instances(&self, n: usize) {
        let n = n.min(self.instance_count().saturating_sub(1));
        self.instances.fetch_sub(n, Ordering::SeqCst);
        self.shared.state.lock().expect("scheduler lock").retiring += n;
        self.shared.ready.notify_all();
    }

    /// Puts this model's instances under the server's rate limiter: instance `n` (in start
    /// order) executes only while `needs[n]` is free (later instances use the last entry).
    /// Set once, right after [`Scheduler::start`] and before any request is queued; the
    /// caller fast path is off for a limited model.
    pub fn set_rate_limits(
        &self,
        limiter: Arc<rate_limit::RateLimiter>,
        needs: Vec<rate_limit::Needs>,
    ) {
        if needs.iter().any(|n| !n.resources.is_empty()) {
            let _hold = limiter.hold(needs.clone());
            let _ = self.shared.limits.set(Limits {
                limiter,
                needs,
                _hold,
            });
        }
    }

    /// Tells the batcher how many requests can be pending for each instance at most (the
    /// sequences holding its slots, one request each): a batch of that many is sent without
    /// waiting out the queue delay. Set once; later calls are ignored.
    pub fn set_instance_demand(&self, demand: Arc<Vec<AtomicUsize>>) {
        let _ = self.shared.demand.set(demand);
    }

    /// How long the longest-running execution in progress has been running (`None` when every
    /// instance waits). A watchdog compares it with a limit: an instance thread stuck in one
    /// execution (a wedged backend) shows here, however busy or idle the queue is.
    pub fn longest_execution(&self) -> Option<Duration> {
        let now = self.shared.epoch.elapsed().as_nanos() as u64 + 1;
        self.slots
            .lock()
            .expect("slots lock")
            .iter()
            .map(|s| s.busy.load(Ordering::Relaxed))
            .filter(|&since| since != 0)
            .map(|since| Duration::from_nanos(now.saturating_sub(since)))
            .max()
    }

    /// Instances serving this queue.
    pub fn instance_count(&self) -> usize {
        self.instances.load(Ordering::SeqCst)
    }

    /// The version's statistics.
    pub fn stats(&self) -> &Arc<ModelStats> {
        &self.shared.stats
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.shared.policy
    }

    /// Queues a request; `respond` is called once with its outcome. Fails at once, without
    /// calling `respond`, when the request's queue is full or the scheduler is stopping (counted
    /// as REJECTED). The request's priority and queue timeout come from its typed
    /// [`InferRequest::scheduling`].
    pub fn enqueue(&self, request: InferRequest, respond: Responder) -> Result<()> {
        self.enqueue_on(request, respond, None)
    }

    /// As [`Scheduler::enqueue`]; with `instance`, only that instance (in start order) runs the
    /// request: a sequence stays on the instance that holds its slot.
    pub fn enqueue_on(
        &self,
        request: InferRequest,
        respond: Responder,
        instance: Option<usize>,
    ) -> Result<()> {
        let sh = &self.shared;
        let p = &sh.policy;
        let level = p.level_for(request.scheduling.priority);
        let timeout = p.timeout_for(level, request.scheduling.timeout_us);
        let batched = p.max_batch_size > 0;
        let rows = request.batch_size(batched);
        let key = shape_key(&request, batched);
        if let Some(t) = &request.trace {
            t.mark("QUEUE_START");
        }
        let now = Instant::now();
        let mut state = sh.state.lock().expect("scheduler lock");
        let reject = if state.stopping {
            Some(format!("model '{}' is unloading", sh.model))
        } else {
            let max = p.levels[level - 1].max_queue_size;
            let lv = &state.levels[level - 1];
            (max > 0 && lv.queue.len() + lv.delayed.len() >= max).then(|| {
                format!(
                    "Exceeds maximum queue size: model '{}' priority level {level} holds {max} requests",
                    sh.model
                )
            })
        };
        if let Some(msg) = reject {
            drop(state);
            sh.stats
                .record_failure(FailReason::Rejected, Duration::ZERO);
            return Err(Error::unavailable(msg));
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.queued += 1;
        sh.inflight.fetch_add(1, Ordering::SeqCst);
        // A timeout too long for the clock to hold a deadline for never passes.
        let deadline = timeout.and_then(|t| now.checked_add(t));
        let reject_at = deadline.filter(|_| p.levels[level - 1].action == TimeoutAction::Reject);
        let job = Job {
            request,
            respond,
            rows,
            shape_key: key,
            enqueued: now,
            deadline,
            reject_at,
            seq,
            affinity: instance,
        };
        state.shapes.add(&job);
        let lv = &mut state.levels[level - 1];
        match lv.queue.back() {
            None => lv.out_of_order = false,
            Some(last) => lv.out_of_order |= passes_after(last.deadline, deadline),
        }
        let mut sooner = false;
        if let Some(d) = deadline {
            if lv.earliest_deadline.is_none_or(|e| d < e) {
                lv.earliest_deadline = Some(d);
                sooner = p.levels[level - 1].action == TimeoutAction::Reject;
            }
        }
        lv.queue.push_back(job);
        drop(state);
        sh.ready.notify_all();
        if sooner {
            // Only when the deadline is earlier than the level's: a notify is a system call.
            sh.timeouts.notify_one();
        }
        Ok(())
    }

    /// As [`Scheduler::enqueue`], except that the request may run on the calling thread before
    /// this returns, when all of these hold: an instance that allows it
    /// ([`Instance::runs_on_caller`]) is idle, nothing is queued, the model's recent executions
    /// averaged at most 100 µs, the request's inputs hold at most 64 KiB, it takes one
    /// response (no [`InferRequest::responses`] stream), and the policy would send a lone
    /// request at once (no `preserve_ordering`, no batcher waiting for more). That is what the
    /// instance thread would do next anyway, minus the hand-off to it and back, which is most
    /// of what a tiny model's request costs at low load. For callers that may
    /// spend that long (an async front end's worker, a plugin's thread) and whose `respond`
    /// takes no lock the execution needs.
    pub fn enqueue_or_run(&self, request: InferRequest, respond: Responder) -> Result<()> {
        self.enqueue_or_run_in(request, respond, &|| Some(Box::new(())))
    }

    /// [`Scheduler::enqueue_or_run`], where an instance that [`Instance::may_stall`] runs on
    /// this thread only with a permit from `lend` (kept until it is done); without one the
    /// request is queued for the instance's own thread. An async caller grants permits to at
    /// most all but one of its runtime's workers, so that a call spinning until its deadline
    /// never takes every worker (health checks, other connections keep one).
    pub fn enqueue_or_run_in(
        &self,
        request: InferRequest,
        respond: Responder,
        lend: &dyn Fn() -> Option<Box<dyn std::any::Any>>,
    ) -> Result<()> {
        let sh = &self.shared;
        let p = &sh.policy;
        let recent = sh.recent_exec_ns.load(Ordering::Relaxed);
        let small = || {
            request
                .inputs
                .iter()
                .try_fold(0usize, |n, t| {
                    n.checked_add(t.data.len())
                        .filter(|&n| n <= ON_CALLER_MAX_BYTES)
                })
                .is_some()
        };
        // A streaming request's responses are sent while it runs, through a sink that may
        // wait for the client: never on an async caller's thread.
        if p.preserve_ordering
            || request.responses.is_some()
            || sh.limits.get().is_some()
            || (p.dynamic && !p.max_queue_delay.is_zero())
            || recent == 0
            || recent > ON_CALLER_MAX_NS
            || !small()
        {
            return self.enqueue(request, respond);
        }
        let slots = Arc::clone(&self.slots.lock().expect("slots lock"));
        let mut state = sh.state.lock().expect("scheduler lock");
        if state.stopping || state.queued > 0 || state.retiring > 0 {
            drop(state);
            return self.enqueue(request, respond);
        }
        let Some(mut instance) = slots.iter().filter(|s| s.on_caller).find_map(|s| {
            let guard = s.instance.try_lock().ok()?;
            guard.is_some().then_some((s, guard))
        }) else {
            drop(state);
            return self.enqueue(request, respond);
        };
        let permit = if instance.0.may_stall {
            match lend() {
                Some(p) => Some(p),
                None => {
                    drop(instance);
                    drop(state);
                    return self.enqueue(request, respond);
                }
            }
        } else {
            None
        };
        let seq = state.next_seq;
        state.next_seq += 1;
        drop(state);
        sh.inflight.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = &request.trace {
            t.mark("QUEUE_START");
        }
        let rows = request.batch_size(p.max_batch_size > 0);
        let job = Job {
            request,
            respond,
            rows,
            shape_key: 0,
            enqueued: Instant::now(),
            deadline: None,
            reject_at: None,
            seq,
            affinity: None,
        };
        let (slot, guard) = &mut instance;
        if let Some(i) = guard.as_mut() {
            run_batch(sh, slot, i.as_mut(), vec![job]);
        }
        drop(permit);
        Ok(())
    }

    /// Requests queued or executing.
    pub fn inflight(&self) -> usize {
        self.shared.inflight.load(Ordering::SeqCst)
    }

    /// Requests queued and not yet executing.
    pub fn pending(&self) -> usize {
        self.shared.state.lock().expect("scheduler lock").queued
    }

    /// Stops accepting requests; queued ones still run. Returns once every instance thread has
    /// finished (call from a blocking context).
    pub fn stop(&self) {
        self.begin_stop().join();
    }

    /// Marks the scheduler stopping, wakes its instances and takes its threads' handles.
    fn begin_stop(&self) -> Draining {
        self.shared.state.lock().expect("scheduler lock").stopping = true;
        self.shared.ready.notify_all();
        Draining {
            shared: self.shared.clone(),
            instances: std::mem::take(&mut *self.threads.lock().expect("threads lock")),
            timeouts: self.timeouts.lock().expect("timeouts lock").take(),
        }
    }
}

/// A stopping scheduler's threads, still draining its queue.
struct Draining {
    shared: Arc<Shared>,
    instances: Vec<JoinHandle<()>>,
    timeouts: Option<JoinHandle<()>>,
}

impl Draining {
    /// Waits for the instance threads to drain the queue, then for the timeout thread, which
    /// serves the drain too and leaves after it.
    fn join(self) {
        for t in self.instances {
            let _ = t.join();
        }
        self.shared
            .state
            .lock()
            .expect("scheduler lock")
            .timeouts_done = true;
        self.shared.timeouts.notify_all();
        if let Some(t) = self.timeouts {
            let _ = t.join();
        }
    }
}

/// Dropping the last reference stops the scheduler without waiting: the queue drains on a
/// thread of its own. A version is dropped wherever its last request ends — on an async
/// worker, under a caller's lock — and an execution that never ends (a wedged backend) must not
/// take that thread with it.
impl Drop for Scheduler {
    fn drop(&mut self) {
        let draining = self.begin_stop();
        if draining.instances.is_empty() && draining.timeouts.is_none() {
            return;
        }
        let name = format!("wisp-{}-drain", self.shared.model);
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || draining.join());
        if let Err(e) = spawned {
            // Without a thread to wait on, the instance threads finish on their own: stopping is
            // set, and they exit once the queue is empty.
            tracing::warn!(model = %self.shared.model, error = %e, "cannot start a drain thread");
        }
    }
}

#[cfg(test)]
mod tests;
