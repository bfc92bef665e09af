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

pub mod ensemble;
mod policy;
pub mod sequence;
mod stats;

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

/// Elements in `request`'s inputs.
fn input_elements(request: &InferRequest) -> u64 {
    request
        .inputs
        .iter()
        .map(|t| t.element_count() as u64)
        .fold(0, u64::saturating_add)
}

/// Receives every completed request's timings (the server feeds latency summaries with it).
pub type Observer = Arc<dyn Fn(&RequestTiming) + Send + Sync>;

struct Job {
    request: InferRequest,
    respond: Responder,
    rows: usize,
    shape_key: u64,
    enqueued: Instant,
    deadline: Option<Instant>,
    seq: u64,
    /// The only instance that may run it (a sequence's instance).
    affinity: Option<usize>,
}

#[derive(Default)]
struct Level {
    queue: VecDeque<Job>,
    /// Timed-out requests under DELAY: served after this level's in-time requests.
    delayed: VecDeque<Job>,
    /// No request in `queue` has a deadline before this (`None`: none has a deadline). A lower
    /// bound: it is lowered when a request comes in and made exact when `expire` scans, and
    /// taking requests out leaves it as it is. It saves scanning a deep queue under the lock
    /// each time an instance looks for work.
    earliest_deadline: Option<Instant>,
    /// Some request in `queue` has an earlier deadline than one ahead of it (a request without
    /// a deadline counts as never expiring). While not, the requests that timed out are a
    /// prefix of the queue and the front's deadline is the earliest, so expiring costs no scan:
    /// the case of a level whose requests all take its default timeout.
    out_of_order: bool,
}

/// `a` passes after `b` (`None`: never).
fn passes_after(a: Option<Instant>, b: Option<Instant>) -> bool {
    match (a, b) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(a), Some(b)) => a > b,
    }
}

struct State {
    levels: Vec<Level>,
    /// The queued requests by shape (counted with the dynamic batcher only).
    shapes: Shapes,
    stopping: bool,
    /// Instances asked to leave (resize down): the next idle ones exit.
    retiring: usize,
    next_seq: u64,
    queued: usize,
    /// The timeout thread leaves (set once every instance thread has left).
    timeouts_done: bool,
}

/// Queued requests (every level, DELAY queues included) that any instance may take, counted by
/// shape: a dynamic batch that holds every one of its shape stops looking, so a shape seen
/// once costs no scan of the queue. Requests pinned to an instance (sequences) are not counted,
/// and nothing is without the dynamic batcher, which never looks past the oldest request.
struct Shapes {
    counting: bool,
    unpinned: usize,
    by_key: std::collections::HashMap<u64, usize>,
}

impl Shapes {
    fn new(counting: bool) -> Self {
        Shapes {
            counting,
            unpinned: 0,
            by_key: Default::default(),
        }
    }

    fn add(&mut self, j: &Job) {
        if self.counting && j.affinity.is_none() {
            self.unpinned += 1;
            *self.by_key.entry(j.shape_key).or_default() += 1;
        }
    }

    fn remove(&mut self, j: &Job) {
        if !self.counting || j.affinity.is_some() {
            return;
        }
        self.unpinned -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.by_key.entry(j.shape_key) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    fn count(&self, key: u64) -> usize {
        self.by_key.get(&key).copied().unwrap_or(0)
    }
}

impl State {
    /// Takes `jobs`, just taken out of the queues, out of the counts of queued requests.
    fn left_queue(&mut self, jobs: &[Job]) {
        self.queued -= jobs.len();
        for j in jobs {
            self.shapes.remove(j);
        }
    }

    /// A lower bound on the earliest deadline of a request queued at a level whose timeout
    /// action `of` accepts (see [`Level::earliest_deadline`]): waiting until then wakes no
    /// later than needed.
    fn earliest_deadline(
        &self,
        policy: &Policy,
        of: impl Fn(TimeoutAction) -> bool,
    ) -> Option<Instant> {
        self.levels
            .iter()
            .zip(&policy.levels)
            .filter(|(_, p)| of(p.action))
            .filter_map(|(lv, _)| lv.earliest_deadline)
            .min()
    }
}

/// Response delivery in request order (`preserve_ordering`).
#[derive(Default)]
struct Ordered {
    next: u64,
    ready: BTreeMap<u64, (Responder, Result<InferResponse>)>,
}

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

/// Hash of every input's name and non-batch dims: only equal keys batch together.
fn shape_key(req: &InferRequest, batched: bool) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut inputs: Vec<_> = req.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    for t in inputs {
        t.name.hash(&mut h);
        let dims = if batched && !t.shape.is_empty() {
            &t.shape[1..]
        } else {
            &t.shape[..]
        };
        dims.hash(&mut h);
    }
    h.finish()
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
                instance: Mutex::new(Some(instance)),
                busy: AtomicU64::new(0),
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
        let job = Job {
            request,
            respond,
            rows,
            shape_key: key,
            enqueued: now,
            deadline,
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
    /// averaged at most 100 µs, the request's inputs hold at most 64 KiB, and the policy would
    /// send a lone request at once (no `preserve_ordering`, no batcher waiting for more). That
    /// is what the instance thread would do next anyway, minus the hand-off to it and back,
    /// which is most of what a tiny model's request costs at low load. For callers that may
    /// spend that long (an async front end's worker, a plugin's thread) and whose `respond`
    /// takes no lock the execution needs.
    pub fn enqueue_or_run(&self, request: InferRequest, respond: Responder) -> Result<()> {
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
        if p.preserve_ordering
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
            seq,
            affinity: None,
        };
        let (slot, guard) = &mut instance;
        if let Some(i) = guard.as_mut() {
            run_batch(sh, slot, i.as_mut(), vec![job]);
        }
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

enum Next {
    Batch(Vec<Job>),
    Wait(Option<Instant>),
    Exit,
}

impl Shared {
    /// Moves (DELAY) or collects (REJECT) requests whose queue timeout passed; with
    /// `reject_only`, leaves the DELAY levels alone.
    fn expire(&self, state: &mut State, now: Instant, rejected: &mut Vec<Job>, reject_only: bool) {
        for (i, lv) in state.levels.iter_mut().enumerate() {
            if lv.earliest_deadline.is_none_or(|d| d > now) {
                continue;
            }
            let action = self.policy.levels[i].action;
            if reject_only && action != TimeoutAction::Reject {
                continue;
            }
            let passed = |j: &Job| j.deadline.is_some_and(|d| d <= now);
            let mut timed_out = |j: Job| match action {
                TimeoutAction::Reject => rejected.push(j),
                TimeoutAction::Delay => lv.delayed.push_back(Job {
                    deadline: None,
                    ..j
                }),
            };
            if !lv.out_of_order {
                while lv.queue.front().is_some_and(passed) {
                    timed_out(lv.queue.pop_front().expect("the front is there"));
                }
                lv.earliest_deadline = lv.queue.front().and_then(|j| j.deadline);
                continue;
            }
            // Out of order: the requests before the first timed-out one stay where they are
            // (read, not moved); the rest are taken off and the in-time ones put back. When
            // the sooner deadlines are the later requests (each asks for less time than the
            // one before it), that is a read of the queue and a short tail.
            let mut out_of_order = false;
            let mut last: Option<Option<Instant>> = None;
            let mut earliest: Option<Instant> = None;
            let mut note = |j: &Job| {
                if let Some(l) = last {
                    out_of_order |= passes_after(l, j.deadline);
                }
                last = Some(j.deadline);
                if let Some(d) = j.deadline {
                    earliest = Some(earliest.map_or(d, |e| e.min(d)));
                }
            };
            let mut first = None;
            for (i, j) in lv.queue.iter().enumerate() {
                if passed(j) {
                    first = Some(i);
                    break;
                }
                note(j);
            }
            // None: the bound was stale, nothing passed, and the bound is now exact.
            if let Some(first) = first {
                for j in lv.queue.split_off(first) {
                    if passed(&j) {
                        timed_out(j);
                    } else {
                        note(&j);
                        lv.queue.push_back(j);
                    }
                }
            }
            lv.earliest_deadline = earliest;
            lv.out_of_order = out_of_order;
        }
        state.left_queue(rejected);
    }

    /// Answers requests whose queue timeout passed under REJECT (not holding the lock).
    fn reject_expired(&self, rejected: Vec<Job>) {
        for job in rejected {
            let msg = format!("Request timeout expired (model '{}')", self.model);
            self.finish_failed(job, Error::unavailable(msg), FailReason::Rejected);
        }
    }

    /// The earliest deadline an idle instance wakes for. With a timeout thread, REJECT
    /// deadlines are its job (an instance that woke for one would find it answered), so
    /// instances wake only for DELAY deadlines, which reorder the queue they serve.
    fn instance_deadline(&self, state: &State) -> Option<Instant> {
        state.earliest_deadline(&self.policy, |a| {
            !(self.timeout_thread && a == TimeoutAction::Reject)
        })
    }

    /// Decides what free instance number `me` does next.
    fn next(&self, state: &mut State, now: Instant, me: usize) -> Next {
        let p = &self.policy;
        // (level, delayed?, index) of candidates in service order
        let order = state.levels.iter().enumerate().flat_map(|(l, lv)| {
            (0..lv.queue.len())
                .map(move |i| (l, false, i))
                .chain((0..lv.delayed.len()).map(move |i| (l, true, i)))
        });
        let job = |l: usize, d: bool, i: usize| -> &Job {
            let lv = &state.levels[l];
            if d {
                &lv.delayed[i]
            } else {
                &lv.queue[i]
            }
        };
        let mut picked: Vec<(usize, bool, usize)> = Vec::new();
        let mut rows = 0;
        let mut blocked = false;
        let mut first_key = None;
        let mut other_shapes = 0usize;
        // With no pinned request queued, every queued request of the batch's shape is in
        // `state.shapes`, so the batch can stop looking once it holds them all (how many: looked
        // up once, with the batch's shape).
        let none_pinned = state.shapes.unpinned == state.queued;
        let mut of_key = None;
        for (l, d, i) in order {
            let j = job(l, d, i);
            if j.affinity.is_some_and(|a| a != me) {
                continue;
            }
            if !p.dynamic {
                picked.push((l, d, i));
                break;
            }
            let key = *first_key.get_or_insert(j.shape_key);
            if j.shape_key != key {
                // Another shape waits: the batch is the oldest request and the queued requests
                // of its shape up to SHAPE_LOOKAHEAD requests of other shapes past it (later
                // ones of other shapes wait for the next batch, so none starves), and it goes
                // now rather than after the queue delay.
                blocked = true;
                other_shapes += 1;
                if other_shapes > SHAPE_LOOKAHEAD {
                    break;
                }
                continue;
            }
            if rows + j.rows > p.max_batch_size.max(1) {
                blocked = !picked.is_empty();
                break;
            }
            rows += j.rows;
            picked.push((l, d, i));
            if rows == p.max_batch_size {
                break;
            }
            let queued_of_key = *of_key.get_or_insert_with(|| state.shapes.count(key));
            if none_pinned && picked.len() == queued_of_key {
                // The rest are of other shapes (scanning on would find only them).
                blocked |= state.queued > picked.len();
                break;
            }
        }
        if picked.is_empty() {
            if state.stopping {
                return Next::Exit;
            }
            return Next::Wait(self.instance_deadline(state));
        }
        let all_that_can_come = self.demand.get().is_some_and(|d| {
            d.get(me)
                .is_some_and(|n| picked.len() >= n.load(Ordering::Relaxed))
        });
        let send_all = !p.dynamic
            || state.stopping
            || blocked
            || all_that_can_come
            || rows >= p.max_batch_size
            || p.max_queue_delay.is_zero();
        if !send_all {
            // The largest prefix whose size is a preferred batch size goes at once.
            let mut sum = 0;
            let mut cut = None;
            for (n, &(l, d, i)) in picked.iter().enumerate() {
                sum += job(l, d, i).rows;
                if p.preferred.contains(&sum) {
                    cut = Some(n + 1);
                }
            }
            let oldest = picked
                .iter()
                .map(|&(l, d, i)| job(l, d, i).enqueued)
                .min()
                .expect("picked is not empty");
            let due = oldest + p.max_queue_delay;
            match cut {
                Some(n) => picked.truncate(n),
                None if now >= due => {}
                None => {
                    let earliest = self.instance_deadline(state);
                    return Next::Wait(Some(earliest.map_or(due, |d| d.min(due))));
                }
            }
        }
        // Take the picked jobs out, highest index first so earlier indices stay valid.
        picked.sort_by(|a, b| b.cmp(a));
        let mut batch: Vec<Job> = picked
            .into_iter()
            .map(|(l, d, i)| {
                let lv = &mut state.levels[l];
                if d {
                    lv.delayed.remove(i)
                } else {
                    lv.queue.remove(i)
                }
                .expect("picked index is valid")
            })
            .collect();
        batch.sort_by_key(|j| j.seq);
        state.left_queue(&batch);
        Next::Batch(batch)
    }

    fn deliver(&self, seq: u64, respond: Responder, result: Result<InferResponse>) {
        if !self.policy.preserve_ordering {
            respond(result);
            return;
        }
        let mut due = Vec::new();
        {
            let mut o = self.ordered.lock().expect("ordering lock");
            o.ready.insert(seq, (respond, result));
            while let Some(entry) = {
                let next = o.next;
                o.ready.remove(&next)
            } {
                o.next += 1;
                due.push(entry);
            }
        }
        for (respond, result) in due {
            respond(result);
        }
    }

    fn finish_failed(&self, job: Job, err: Error, reason: FailReason) {
        self.stats.record_failure(reason, job.enqueued.elapsed());
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        if let Some(o) = &self.observer {
            o(&RequestTiming {
                ok: false,
                total: job.enqueued.elapsed(),
                queue: job.enqueued.elapsed(),
                exec: ExecTiming::default(),
                elements: input_elements(&job.request),
            });
        }
        self.deliver(job.seq, job.respond, Err(err));
    }
}

/// The loop of the thread started for instance `me`, until it retires or the scheduler stops.
fn run_instance(shared: &Shared, slot: &Slot, me: usize) {
    if let Some(i) = slot.lock().as_mut() {
        i.on_thread_start();
    }
    loop {
        let mut rejected = Vec::new();
        let batch = {
            let mut state = shared.state.lock().expect("scheduler lock");
            loop {
                if state.retiring > 0 {
                    state.retiring -= 1;
                    return;
                }
                let now = Instant::now();
                shared.expire(&mut state, now, &mut rejected, false);
                if !rejected.is_empty() {
                    break None;
                }
                match shared.next(&mut state, now, me) {
                    Next::Batch(b) => break Some(b),
                    Next::Exit => return,
                    Next::Wait(None) => {
                        state = shared.ready.wait(state).expect("scheduler lock");
                    }
                    Next::Wait(Some(t)) => {
                        let d = t.saturating_duration_since(now);
                        state = shared
                            .ready
                            .wait_timeout(state, d)
                            .expect("scheduler lock")
                            .0;
                    }
                }
            }
        };
        shared.reject_expired(rejected);
        if let Some(batch) = batch {
            let mut guard = slot.lock();
            match guard.as_mut() {
                Some(i) => run_batch(shared, slot, i.as_mut(), batch),
                // Only this thread empties its slot, when it leaves: cannot happen.
                None => {
                    for job in batch {
                        let e = Error::internal(format!(
                            "model '{}': instance {me} is gone",
                            shared.model
                        ));
                        shared.finish_failed(job, e, FailReason::Backend);
                    }
                }
            }
        }
    }
}

/// The loop of the timeout thread, until the scheduler has stopped: it answers requests whose
/// REJECT deadline passes while no instance looks at the queue (all of them are executing).
/// Instances also expire requests when they look for work, so DELAY needs no thread: a delayed
/// request is only ever reordered behind others, which matters only once an instance is free.
fn run_timeouts(shared: &Shared) {
    let mut state = shared.state.lock().expect("scheduler lock");
    let mut last_scan: Option<Instant> = None;
    while !state.timeouts_done {
        let now = Instant::now();
        let rejects = |a| a == TimeoutAction::Reject;
        let Some(due) = state.earliest_deadline(&shared.policy, rejects) else {
            state = shared.timeouts.wait(state).expect("scheduler lock");
            continue;
        };
        let due = last_scan.map_or(due, |t| due.max(t + TIMEOUT_SCAN_GAP));
        if due > now {
            state = shared
                .timeouts
                .wait_timeout(state, due - now)
                .expect("scheduler lock")
                .0;
            continue;
        }
        // A scan also makes the levels' bounds exact, so a stale bound is passed only once.
        let mut rejected = Vec::new();
        shared.expire(&mut state, now, &mut rejected, true);
        last_scan = Some(now);
        if !rejected.is_empty() {
            drop(state);
            shared.reject_expired(rejected);
            state = shared.state.lock().expect("scheduler lock");
        }
    }
}

/// Executes `batch` on `slot`'s instance (held by the caller), with the slot marked busy.
fn run_batch(shared: &Shared, slot: &Slot, instance: &mut dyn Instance, batch: Vec<Job>) {
    slot.busy.store(
        shared.epoch.elapsed().as_nanos() as u64 + 1,
        Ordering::Relaxed,
    );
    execute(shared, instance, batch);
    slot.busy.store(0, Ordering::Relaxed);
}

fn execute(shared: &Shared, instance: &mut dyn Instance, batch: Vec<Job>) {
    let dispatched = Instant::now();
    let rows: usize = batch.iter().map(|j| j.rows).sum();
    let mut requests = Vec::with_capacity(batch.len());
    let mut metas = Vec::with_capacity(batch.len());
    for j in batch {
        metas.push((j.seq, j.respond, j.enqueued, input_elements(&j.request)));
        requests.push(j.request);
    }
    let mut timing = ExecTiming::default();
    let started_wall = wisp_core::trace::unix_ns(std::time::SystemTime::now());
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        instance.execute(&requests, &mut timing)
    }));
    let took = started.elapsed().as_nanos() as u64;
    let recent = shared.recent_exec_ns.load(Ordering::Relaxed);
    let took_1 = took.max(1);
    shared.recent_exec_ns.store(
        if recent == 0 {
            took_1
        } else {
            (recent.saturating_mul(7).saturating_add(took_1)) / 8
        },
        Ordering::Relaxed,
    );
    if timing == ExecTiming::default() {
        timing.infer_ns = took;
    }
    for t in requests.iter().filter_map(|r| r.trace.as_ref()) {
        t.mark_at("COMPUTE_START", started_wall);
        t.mark_at(
            "COMPUTE_INPUT_END",
            started_wall.saturating_add(timing.input_ns),
        );
        t.mark_at(
            "COMPUTE_OUTPUT_START",
            started_wall.saturating_add(took.saturating_sub(timing.output_ns)),
        );
        t.mark_at("COMPUTE_END", started_wall.saturating_add(took));
    }
    let n = requests.len();
    let results: Vec<Result<InferResponse>> = match result {
        Ok(v) if v.len() == n => v,
        Ok(v) => {
            let e = Error::internal(format!(
                "model '{}': backend returned {} responses for {n} requests",
                shared.model,
                v.len()
            ));
            (0..n).map(|_| Err(e.clone())).collect()
        }
        Err(_) => {
            let e = Error::internal(format!(
                "model '{}': backend panicked while executing",
                shared.model
            ));
            (0..n).map(|_| Err(e.clone())).collect()
        }
    };
    let mut results = results;
    for r in results.iter_mut().flatten() {
        r.compute = Some(timing);
    }
    let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
    if ok > 0 {
        shared.stats.record_execution(rows, ok, timing);
    }
    for ((seq, respond, enqueued, elements), result) in metas.into_iter().zip(results) {
        let total = enqueued.elapsed();
        let queue = dispatched - enqueued;
        match &result {
            Ok(_) => {
                shared.stats.success.add(total);
                shared.stats.queue.add(queue);
            }
            Err(_) => {
                shared.stats.record_failure(FailReason::Backend, total);
            }
        }
        if let Some(o) = &shared.observer {
            o(&RequestTiming {
                ok: result.is_ok(),
                total,
                queue,
                exec: timing,
                elements,
            });
        }
        shared.inflight.fetch_sub(1, Ordering::SeqCst);
        shared.deliver(seq, respond, result);
    }
}

#[cfg(test)]
mod tests;
