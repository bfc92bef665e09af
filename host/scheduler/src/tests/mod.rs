//! Scheduler behaviour with real threads but no timing races: a gated test instance holds each
//! execution until the test releases it, so queues fill deterministically; the only time-based
//! checks use generous margins.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::config::{DynamicBatching, ModelConfig, QueuePolicy};
use wisp_core::tensor::{concat_batch, split_batch};
use wisp_core::{DataType, ErrorKind, InferRequest, InferResponse, Result, Tensor};

use crate::{FailReason, Policy, Scheduler};

const WAIT: Duration = Duration::from_secs(10);

/// Doubles its single FP32 input, after concatenating the batch (as the ONNX backend does).
/// Before executing a batch whose first request id starts with `hold`, it reports the batch's
/// ids on `started` and waits for a permit.
struct Gated {
    hold: &'static str,
    started: Sender<Vec<String>>,
    permits: Arc<Mutex<Receiver<()>>>,
}

impl Instance for Gated {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _t: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let ids: Vec<String> = batch.iter().map(|r| r.id.clone()).collect();
        let _ = self.started.send(ids.clone());
        if ids[0].starts_with(self.hold) {
            self.permits
                .lock()
                .unwrap()
                .recv_timeout(WAIT)
                .expect("permit");
        }
        if ids.iter().any(|i| i == "panic") {
            panic!("boom");
        }
        let parts: Vec<&Tensor> = batch.iter().map(|r| &r.inputs[0]).collect();
        let all = concat_batch(&parts).unwrap();
        let doubled: Vec<u8> = all
            .data
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes(c.try_into().unwrap()) * 2.0).to_le_bytes())
            .collect();
        let out = Tensor {
            name: "y".into(),
            data: doubled.into(),
            ..all
        };
        let sizes: Vec<usize> = batch.iter().map(|r| r.batch_size(true)).collect();
        split_batch(&out, &sizes)
            .unwrap()
            .into_iter()
            .map(|t| Ok(InferResponse::new(vec![t])))
            .collect()
    }
}

struct Harness {
    s: Scheduler,
    started: Receiver<Vec<String>>,
    permit: Sender<()>,
    done: Receiver<(String, Result<InferResponse>)>,
    done_tx: Sender<(String, Result<InferResponse>)>,
}

fn policy(mbs: i32, db: Option<DynamicBatching>) -> Policy {
    let cfg = ModelConfig {
        max_batch_size: mbs,
        dynamic_batching: db,
        ..Default::default()
    };
    Policy::from_config(&cfg, None)
}

fn harness(policy: Policy, instances: usize, hold: &'static str) -> Harness {
    let (started_tx, started) = channel();
    let (permit, permits) = channel();
    let permits = Arc::new(Mutex::new(permits));
    let inst: Vec<Box<dyn Instance>> = (0..instances)
        .map(|_| {
            Box::new(Gated {
                hold,
                started: started_tx.clone(),
                permits: permits.clone(),
            }) as Box<dyn Instance>
        })
        .collect();
    let (done_tx, done) = channel();
    Harness {
        s: Scheduler::start("test", policy, inst, None).unwrap(),
        started,
        permit,
        done,
        done_tx,
    }
}

fn req(id: &str, rows: usize, params: serde_json::Value) -> InferRequest {
    req_wide(id, rows, 1, params)
}

/// A request whose input is `rows` × `width`: requests of different widths never batch.
fn req_wide(id: &str, rows: usize, width: usize, params: serde_json::Value) -> InferRequest {
    let data: Vec<u8> = (0..rows * width)
        .flat_map(|i| (i as f32 + 1.0).to_le_bytes())
        .collect();
    let parameters = params.as_object().cloned().unwrap_or_default();
    let shape = vec![rows as i64, width as i64];
    InferRequest {
        id: id.into(),
        inputs: vec![Tensor::new("x", DataType::Fp32, shape, data.into()).unwrap()],
        scheduling: wisp_core::infer::Scheduling::from_parameters(&parameters).unwrap(),
        parameters,
        ..Default::default()
    }
}

impl Harness {
    fn send(&self, id: &str, rows: usize, params: serde_json::Value) -> Result<()> {
        self.submit(req(id, rows, params))
    }
    fn send_wide(&self, id: &str, width: usize) -> Result<()> {
        self.submit(req_wide(id, 1, width, serde_json::json!({})))
    }
    /// Enqueues `r`; its response comes back on `done` under its id.
    fn submit(&self, r: InferRequest) -> Result<()> {
        let tx = self.done_tx.clone();
        let id = r.id.clone();
        self.s
            .enqueue(r, Box::new(move |res| tx.send((id, res)).unwrap()))
    }
    /// Sends "hold" with `rows` rows and waits until the instance is executing it, alone;
    /// requests sent next queue behind it until [`Harness::release`].
    fn hold(&self, rows: usize) {
        self.send("hold", rows, serde_json::json!({})).unwrap();
        assert_eq!(self.batch_started(), vec!["hold"]);
    }
    fn batch_started(&self) -> Vec<String> {
        self.started.recv_timeout(WAIT).expect("a batch starts")
    }
    fn release(&self) {
        self.permit.send(()).unwrap();
    }
    fn result(&self) -> (String, Result<InferResponse>) {
        self.done.recv_timeout(WAIT).expect("a response")
    }
    /// The next `n` responses as (id, succeeded), sorted by id.
    fn outcomes(&self, n: usize) -> Vec<(String, bool)> {
        let mut got: Vec<(String, bool)> = (0..n)
            .map(|_| {
                let (id, r) = self.result();
                (id, r.is_ok())
            })
            .collect();
        got.sort();
        got
    }
}

/// One instance holding batches that start with `hold`, behind a dynamic batcher with
/// `queue` as its default queue policy.
fn queued(max_batch_size: i32, queue: QueuePolicy) -> Harness {
    harness(
        policy(
            max_batch_size,
            dynamic(|d| d.default_queue_policy = Some(queue)),
        ),
        1,
        "hold",
    )
}

/// What the scheduler counts of its queued requests by shape: (requests, shapes). Both are 0
/// once every request has been taken or rejected.
fn shapes_counted(s: &Scheduler) -> (usize, usize) {
    let st = s.shared.state.lock().unwrap();
    (st.shapes.unpinned, st.shapes.by_key.len())
}

fn dynamic(f: impl FnOnce(&mut DynamicBatching)) -> Option<DynamicBatching> {
    let mut db = DynamicBatching::default();
    f(&mut db);
    Some(db)
}

mod batching;
mod rate_limit;
mod timeouts;

#[test]
fn preserve_ordering_holds_back_later_responses() {
    for preserve in [false, true] {
        let h = harness(
            policy(1, dynamic(|d| d.preserve_ordering = preserve)),
            2,
            "slow",
        );
        h.send("slow", 1, serde_json::json!({})).unwrap();
        h.batch_started();
        h.send("fast", 1, serde_json::json!({})).unwrap();
        h.batch_started();
        if !preserve {
            assert_eq!(h.result().0, "fast");
            h.release();
            assert_eq!(h.result().0, "slow");
        } else {
            // fast has finished executing but must wait for slow
            assert!(h.done.recv_timeout(Duration::from_millis(200)).is_err());
            h.release();
            assert_eq!(h.result().0, "slow");
            assert_eq!(h.result().0, "fast");
        }
    }
}

#[test]
fn serves_every_request_and_survives_a_panic() {
    let h = harness(policy(0, None), 2, "never");
    for id in ["a", "panic", "b", "c"] {
        h.send(id, 1, serde_json::json!({})).unwrap();
    }
    let got = h.outcomes(4);
    assert_eq!(
        got,
        vec![
            ("a".into(), true),
            ("b".into(), true),
            ("c".into(), true),
            ("panic".into(), false)
        ]
    );
    assert_eq!(h.s.inflight(), 0);
    assert_eq!(h.s.stats().failures(FailReason::Backend), 1);
}

#[test]
fn stop_drains_then_rejects() {
    let h = harness(
        policy(4, dynamic(|d| d.max_queue_delay_microseconds = 10_000_000)),
        1,
        "never",
    );
    for i in 0..20 {
        h.send(&i.to_string(), 1, serde_json::json!({})).unwrap();
    }
    h.s.stop();
    assert_eq!(h.done.try_iter().filter(|(_, r)| r.is_ok()).count(), 20);
    let e = h.send("late", 1, serde_json::json!({})).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
}

#[test]
fn instances_are_added_and_retired_in_place() {
    let h = harness(policy(1, dynamic(|_| {})), 1, "hold");
    assert_eq!(h.s.instance_count(), 1);
    let (started_tx, started) = channel();
    let (_permit, permits) = channel();
    let extra: Vec<Box<dyn Instance>> = (0..2)
        .map(|_| {
            Box::new(Gated {
                hold: "never",
                started: started_tx.clone(),
                permits: Arc::new(Mutex::new(permits_clone(&permits))),
            }) as Box<dyn Instance>
        })
        .collect();
    drop(started);
    // the original instance is held busy; the instances added afterwards serve the queue
    h.hold(1);
    h.s.add_instances(extra).unwrap();
    assert_eq!(h.s.instance_count(), 3);
    for id in ["a", "b"] {
        h.send(id, 1, serde_json::json!({})).unwrap();
    }
    let mut got: Vec<String> = (0..2).map(|_| h.result().0).collect();
    got.sort();
    assert_eq!(got, vec!["a", "b"]);
    h.s.retire_instances(5);
    assert_eq!(h.s.instance_count(), 1, "at least one instance stays");
    h.release();
    assert_eq!(h.result().0, "hold");
    h.send("after", 1, serde_json::json!({})).unwrap();
    assert_eq!(h.result().0, "after");
}

/// A receiver that never gets a permit (the added instances never hold).
fn permits_clone(_: &Receiver<()>) -> Receiver<()> {
    channel().1
}

#[test]
fn a_stuck_execution_shows_in_longest_execution() {
    let h = harness(policy(4, None), 2, "stuck");
    assert_eq!(
        h.s.longest_execution(),
        None,
        "idle instances are not executing"
    );
    h.send("stuck", 1, serde_json::json!({})).unwrap();
    assert_eq!(h.batch_started(), vec!["stuck"]);
    std::thread::sleep(Duration::from_millis(60));
    let held = h.s.longest_execution().expect("one instance is executing");
    assert!(held >= Duration::from_millis(50), "{held:?}");
    // The other instance still serves; the stuck one still shows.
    h.send("quick", 1, serde_json::json!({})).unwrap();
    assert_eq!(h.result().0, "quick");
    assert!(h.s.longest_execution().unwrap() >= held);
    h.release();
    assert_eq!(h.result().0, "stuck");
    let deadline = Instant::now() + WAIT;
    while h.s.longest_execution().is_some() {
        assert!(
            Instant::now() < deadline,
            "the instance went back to waiting"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Answers every request with no outputs, reporting each request's id and the thread that ran
/// it; a request whose id starts with `hold` waits for a permit first.
struct Here {
    ran: Sender<(String, std::thread::ThreadId)>,
    permits: Arc<Mutex<Receiver<()>>>,
    on_caller: bool,
    may_stall: bool,
}

impl Instance for Here {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _t: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        for r in batch {
            if r.id.starts_with("hold") {
                self.permits
                    .lock()
                    .unwrap()
                    .recv_timeout(WAIT)
                    .expect("permit");
            }
            let _ = self.ran.send((r.id.clone(), std::thread::current().id()));
        }
        batch.iter().map(|_| Ok(InferResponse::default())).collect()
    }

    fn runs_on_caller(&self) -> bool {
        self.on_caller
    }

    fn may_stall(&self) -> bool {
        self.may_stall
    }
}

type Ran = Receiver<(String, std::thread::ThreadId)>;

fn here(policy: Policy, on_caller: bool) -> (Arc<Scheduler>, Ran, Sender<()>) {
    here_stalling(policy, on_caller, false)
}

fn here_stalling(
    policy: Policy,
    on_caller: bool,
    may_stall: bool,
) -> (Arc<Scheduler>, Ran, Sender<()>) {
    let (ran_tx, ran) = channel();
    let (permit, permits) = channel();
    let inst = Here {
        ran: ran_tx,
        permits: Arc::new(Mutex::new(permits)),
        on_caller,
        may_stall,
    };
    let s = Scheduler::start("test", policy, vec![Box::new(inst)], None).unwrap();
    (Arc::new(s), ran, permit)
}

/// `enqueue_or_run` from this thread; returns the receiver of the response.
fn submit(s: &Scheduler, id: &str) -> Receiver<Result<InferResponse>> {
    let (tx, rx) = channel();
    s.enqueue_or_run(
        req(id, 1, serde_json::json!({})),
        Box::new(move |r| tx.send(r).unwrap()),
    )
    .unwrap();
    rx
}

/// Waits (boundedly) until no instance executes, then a little more, so that the instance
/// thread has let go of its instance after answering.
fn settle(s: &Scheduler) {
    let until = Instant::now() + WAIT;
    while s.longest_execution().is_some() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
}

/// The thread request `id` ran on.
fn ran_on(ran: &Ran, id: &str) -> std::thread::ThreadId {
    let (got, thread) = ran.recv_timeout(WAIT).expect("an execution");
    assert_eq!(got, id);
    thread
}

#[test]
fn a_short_request_to_an_idle_instance_runs_on_the_caller() {
    let (s, ran, _permit) = here(policy(0, None), true);
    let me = std::thread::current().id();
    // Nothing measured yet: the first request goes to the instance thread.
    submit(&s, "a").recv_timeout(WAIT).unwrap().unwrap();
    assert_ne!(ran_on(&ran, "a"), me);
    settle(&s);
    // Now the model is known to be quick and its instance idle: this thread runs the next,
    // and its answer is there when `enqueue_or_run` returns.
    let rx = submit(&s, "b");
    assert_eq!(ran_on(&ran, "b"), me);
    rx.try_recv().expect("answered before returning").unwrap();
    let st = s.stats();
    assert_eq!(st.execution_count(), 2);
    assert_eq!(st.success.get().0, 2);
    assert_eq!(s.inflight(), 0);
    assert_eq!(s.longest_execution(), None);
}

#[test]
fn an_instance_that_may_stall_runs_on_the_caller_only_with_a_permit() {
    for (may_stall, grant) in [(false, false), (true, true), (true, false)] {
        let (s, ran, _permit) = here_stalling(policy(0, None), true, may_stall);
        let me = std::thread::current().id();
        submit(&s, "a").recv_timeout(WAIT).unwrap().unwrap();
        ran_on(&ran, "a");
        settle(&s);
        let asked = std::cell::Cell::new(0);
        let (tx, rx) = channel();
        s.enqueue_or_run_in(
            req("b", 1, serde_json::json!({})),
            Box::new(move |r| tx.send(r).unwrap()),
            &|| {
                asked.set(asked.get() + 1);
                grant.then(|| Box::new(()) as Box<dyn std::any::Any>)
            },
        )
        .unwrap();
        let here = !may_stall || grant;
        assert_eq!(
            ran_on(&ran, "b") == me,
            here,
            "may_stall {may_stall}, grant {grant}"
        );
        rx.recv_timeout(WAIT).unwrap().unwrap();
        assert_eq!(asked.get(), usize::from(may_stall), "may_stall {may_stall}");
        assert_eq!(s.inflight(), 0);
    }
}

#[test]
fn a_busy_instance_leaves_the_request_to_its_thread() {
    let (s, ran, permit) = here(policy(0, None), true);
    let me = std::thread::current().id();
    submit(&s, "a").recv_timeout(WAIT).unwrap().unwrap();
    ran_on(&ran, "a");
    settle(&s);
    // The instance thread holds "hold" until the permit: "b" must be queued, not run here.
    let held = {
        let (tx, rx) = channel();
        s.enqueue(
            req("hold", 1, serde_json::json!({})),
            Box::new(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        rx
    };
    let until = Instant::now() + WAIT;
    while s.longest_execution().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Were "b" to wait for the instance here, the permit sent later would let it run on this
    // thread, which the assertion below catches.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        permit.send(()).unwrap();
    });
    let b = submit(&s, "b");
    releaser.join().unwrap();
    let hold_thread = ran_on(&ran, "hold");
    assert_eq!(ran_on(&ran, "b"), hold_thread);
    assert_ne!(hold_thread, me);
    held.recv_timeout(WAIT).unwrap().unwrap();
    b.recv_timeout(WAIT).unwrap().unwrap();
}

#[test]
fn instances_that_do_not_allow_it_or_ordered_policies_never_run_on_the_caller() {
    let ordered = policy(
        4,
        dynamic(|d| {
            d.preserve_ordering = true;
        }),
    );
    for (policy, on_caller) in [(policy(0, None), false), (ordered, true)] {
        let (s, ran, _permit) = here(policy, on_caller);
        let me = std::thread::current().id();
        for id in ["a", "b", "c"] {
            submit(&s, id).recv_timeout(WAIT).unwrap().unwrap();
            assert_ne!(ran_on(&ran, id), me, "{id}");
        }
    }
}

#[test]
fn an_instance_added_in_place_serves_the_callers_fast_path() {
    // The first instance does not allow running on the caller; one added by a resize does.
    let (s, ran, _permit) = here(policy(0, None), false);
    let (_, permits) = channel();
    let (ran_tx, ran2) = channel();
    s.add_instances(vec![Box::new(Here {
        ran: ran_tx,
        permits: Arc::new(Mutex::new(permits)),
        on_caller: true,
        may_stall: false,
    })])
    .unwrap();
    let me = std::thread::current().id();
    // The first request measures the model, on whichever instance thread takes it.
    submit(&s, "a").recv_timeout(WAIT).unwrap().unwrap();
    let first = ran
        .recv_timeout(Duration::from_millis(100))
        .or_else(|_| ran2.recv_timeout(WAIT))
        .expect("an execution");
    assert_ne!(first.1, me);
    settle(&s);
    // The next runs here, on the added instance, skipping the one that does not allow it.
    let rx = submit(&s, "b");
    assert_eq!(ran_on(&ran2, "b"), me);
    rx.try_recv().expect("answered before returning").unwrap();
    assert!(ran.try_recv().is_err(), "the first instance ran 'b' too");
}
