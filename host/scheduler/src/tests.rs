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

#[test]
fn batches_fill_up_to_max_batch_size_and_answer_the_right_request() {
    let h = harness(policy(4, dynamic(|_| {})), 1, "hold");
    h.hold(1);
    // queued while the instance is busy: rows 1, 2, 1, 3 → batches [a,b,c] (4 rows) then [d]
    for (id, rows) in [("a", 1), ("b", 2), ("c", 1), ("d", 3)] {
        h.send(id, rows, serde_json::json!({})).unwrap();
    }
    h.release();
    assert_eq!(h.batch_started(), vec!["a", "b", "c"]);
    assert_eq!(h.batch_started(), vec!["d"]);
    for _ in 0..5 {
        let (id, r) = h.result();
        let out = &r.unwrap().outputs[0];
        let rows = match id.as_str() {
            "b" => 2,
            "d" => 3,
            _ => 1,
        };
        assert_eq!(out.shape, vec![rows, 1], "{id}");
        let v: Vec<f32> = out
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (0..rows).map(|i| (i as f32 + 1.0) * 2.0).collect();
        assert_eq!(v, want, "{id} got another request's rows");
    }
    let st = h.s.stats();
    assert_eq!(st.execution_count(), 3);
    assert_eq!(st.inference_count(), 8);
    assert_eq!(st.success.get().0, 5);
    let b = st.batch_stats();
    assert_eq!(b[&4].count, 1);
    assert_eq!(b[&3].count, 1);
}

#[test]
fn a_preferred_size_goes_at_once_and_a_lone_request_after_the_delay() {
    let h = harness(
        policy(
            8,
            dynamic(|d| {
                d.preferred_batch_size = vec![2];
                d.max_queue_delay_microseconds = 100_000;
            }),
        ),
        1,
        "hold",
    );
    h.hold(1);
    for id in ["a", "b", "c"] {
        h.send(id, 1, serde_json::json!({})).unwrap();
    }
    h.release();
    // a preferred batch of 2 is formed from the 3 queued, without waiting for the delay
    assert_eq!(h.batch_started(), vec!["a", "b"]);
    // c is alone: it leaves once it has waited max_queue_delay (100 ms)
    assert_eq!(h.batch_started(), vec!["c"]);
    let t = Instant::now();
    h.send("lone", 1, serde_json::json!({})).unwrap();
    assert_eq!(h.batch_started(), vec!["lone"]);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(100),
        "left after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "left after {waited:?}");
}

#[test]
fn a_batch_gathers_its_shape_past_others_but_only_so_far() {
    let h = harness(policy(8, dynamic(|_| {})), 1, "hold");
    h.hold(1);
    // a0 is oldest; 3 requests of another shape separate a1 from it, and SHAPE_LOOKAHEAD + 1
    // separate a2
    h.send_wide("a0", 2).unwrap();
    for i in 0..3 {
        h.send_wide(&format!("b{i:03}"), 1).unwrap();
    }
    h.send_wide("a1", 2).unwrap();
    for i in 3..=crate::SHAPE_LOOKAHEAD {
        h.send_wide(&format!("b{i:03}"), 1).unwrap();
    }
    h.send_wide("a2", 2).unwrap();
    h.release();
    // the first batch looks past the b's for a1 but stops before reaching a2
    assert_eq!(h.batch_started(), vec!["a0", "a1"]);
    // then the b's go in full batches, FIFO, and a2 is served in its turn, after them all
    let b: Vec<String> = (0..8).map(|i| format!("b{i:03}")).collect();
    assert_eq!(h.batch_started(), b);
    // hold, the three a's and SHAPE_LOOKAHEAD + 1 b's
    let n = crate::SHAPE_LOOKAHEAD + 5;
    let got = h.outcomes(n);
    assert!(got.iter().all(|(_, ok)| *ok), "every request is served");
    assert_eq!(got.len(), n);
    let mut last = Vec::new();
    while let Ok(ids) = h.started.recv_timeout(Duration::from_millis(10)) {
        last = ids;
    }
    assert_eq!(last, vec!["a2"], "a2 goes last, alone");
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

#[test]
fn a_batch_holding_all_of_its_shape_goes_at_once_and_the_rest_batch_by_shape() {
    let h = harness(
        policy(8, dynamic(|d| d.max_queue_delay_microseconds = 60_000_000)),
        1,
        "hold",
    );
    // a full batch: it goes without waiting for the queue delay
    h.hold(8);
    for (id, width) in [
        ("a0", 2),
        ("b0", 1),
        ("c0", 3),
        ("b1", 1),
        ("a1", 2),
        ("b2", 1),
    ] {
        h.send_wide(id, width).unwrap();
    }
    assert_eq!(shapes_counted(&h.s), (6, 3));
    h.release();
    // each batch is one shape, oldest first, and goes at once while another shape waits
    assert_eq!(h.batch_started(), vec!["a0", "a1"]);
    assert_eq!(h.batch_started(), vec!["b0", "b1", "b2"]);
    // c0, left alone, waits for the (long) queue delay, until its batch fills
    let c: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    for id in &c[1..] {
        h.send_wide(id, 3).unwrap();
    }
    assert_eq!(h.batch_started(), c);
    let got = h.outcomes(14);
    assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

#[test]
fn priorities_order_service() {
    let h = harness(
        policy(
            1,
            dynamic(|d| {
                d.priority_levels = 2;
                d.default_priority_level = 2;
            }),
        ),
        1,
        "hold",
    );
    h.hold(1);
    h.send("low1", 1, serde_json::json!({})).unwrap();
    h.send("low2", 1, serde_json::json!({"priority": 2}))
        .unwrap();
    h.send("high", 1, serde_json::json!({"priority": 1}))
        .unwrap();
    h.release();
    assert_eq!(h.batch_started(), vec!["high"]);
    assert_eq!(h.batch_started(), vec!["low1"]);
    assert_eq!(h.batch_started(), vec!["low2"]);
}

#[test]
fn a_full_queue_rejects_at_once_without_disturbing_others() {
    let h = queued(
        4,
        QueuePolicy {
            max_queue_size: 2,
            ..Default::default()
        },
    );
    h.hold(1);
    h.send("a", 1, serde_json::json!({})).unwrap();
    h.send("b", 1, serde_json::json!({})).unwrap();
    let e = h.send("c", 1, serde_json::json!({})).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("Exceeds maximum queue size"), "{e}");
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 1);
    h.release();
    let mut ok: Vec<String> = (0..3)
        .map(|_| {
            let (id, r) = h.result();
            assert!(r.is_ok());
            id
        })
        .collect();
    ok.sort();
    assert_eq!(ok, vec!["a", "b", "hold"]);
}

#[test]
fn timeouts_reject_or_delay() {
    // REJECT (default action): the queued request times out while the instance is busy.
    let h = held_behind(QueuePolicy {
        default_timeout_microseconds: 50_000,
        ..Default::default()
    });
    h.send("late", 1, serde_json::json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    h.release();
    let got = h.outcomes(2);
    assert_eq!(got, vec![("hold".into(), true), ("late".into(), false)]);
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 1);
    assert_eq!(shapes_counted(&h.s), (0, 0));

    // DELAY: a timed-out request is served after the in-time ones of its level.
    let h = held_behind(QueuePolicy {
        timeout_action: wisp_core::config::TimeoutAction::Delay,
        allow_timeout_override: true,
        ..Default::default()
    });
    h.send("late", 1, serde_json::json!({"timeout": 20_000}))
        .unwrap();
    h.send("b", 1, serde_json::json!({})).unwrap();
    h.send("c", 1, serde_json::json!({})).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    h.release();
    assert_eq!(h.batch_started(), vec!["b"]);
    assert_eq!(h.batch_started(), vec!["c"]);
    assert_eq!(h.batch_started(), vec!["late"]);
    for _ in 0..4 {
        assert!(h.result().1.is_ok());
    }
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

/// One instance, executing a held request ("hold"), behind a queue with `queue` as its
/// default policy and batches of one.
fn held_behind(queue: QueuePolicy) -> Harness {
    let h = queued(1, queue);
    h.hold(1);
    h
}

/// One instance, executing a held request, behind a REJECT queue whose default timeout (5 s)
/// requests may lower.
fn held_behind_reject_timeouts() -> Harness {
    held_behind(QueuePolicy {
        default_timeout_microseconds: 5_000_000,
        allow_timeout_override: true,
        ..Default::default()
    })
}

/// Under REJECT, a queued request is answered when its timeout passes, not when an instance
/// next frees up (Triton's batcher does the same while it waits for a free instance); a sooner
/// deadline that arrives later is answered first.
#[test]
fn a_rejected_timeout_is_answered_while_every_instance_is_busy() {
    let h = held_behind_reject_timeouts();
    assert!(h.s.timeouts.lock().unwrap().is_some(), "a timeout thread");
    let sent = Instant::now();
    // The thread waits for the 5 s deadline when the 50 ms one comes in.
    h.send("slow", 1, serde_json::json!({})).unwrap();
    h.send("fast", 1, serde_json::json!({"timeout": 50_000}))
        .unwrap();
    assert!(out_of_order(&h.s), "a sooner deadline behind a later one");
    let (id, r) = h.result();
    let waited = sent.elapsed();
    assert_eq!(id, "fast");
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.message().contains("Request timeout expired"), "{e}");
    assert!(waited >= Duration::from_millis(50), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "answered late: {waited:?}");
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 1);
    assert_eq!(h.s.pending(), 1);
    assert_eq!(h.s.inflight(), 2);
    assert!(!out_of_order(&h.s), "made exact by the scan");
    h.release();
    assert_eq!(
        h.outcomes(2),
        vec![("hold".into(), true), ("slow".into(), true)]
    );
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

/// With deadlines in queue order, the timed-out requests are the front of the queue: they
/// leave from there, and the rest stay queued in order.
#[test]
fn timed_out_requests_leave_from_the_front_of_an_ordered_queue() {
    let h = held_behind_reject_timeouts();
    for id in ["a", "b", "c"] {
        h.send(id, 1, serde_json::json!({"timeout": 50_000}))
            .unwrap();
    }
    for id in ["d", "e"] {
        h.send(id, 1, serde_json::json!({})).unwrap();
    }
    assert!(!out_of_order(&h.s));
    assert_eq!(
        h.outcomes(3),
        vec![
            ("a".into(), false),
            ("b".into(), false),
            ("c".into(), false)
        ]
    );
    assert_eq!(h.s.pending(), 2);
    h.release();
    assert_eq!(h.result().0, "hold");
    assert_eq!(h.batch_started(), vec!["d"]);
    assert_eq!(h.batch_started(), vec!["e"]);
    assert_eq!(h.outcomes(2), vec![("d".into(), true), ("e".into(), true)]);
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 3);
    assert_eq!(shapes_counted(&h.s), (0, 0));
}

/// A request may give the longest timeout there is (2^64 - 1 µs) to a level that lets it set
/// one with no default: it waits for its turn, and the timeout thread still answers a sooner
/// deadline queued behind it.
#[test]
fn the_longest_timeout_is_queued_and_served() {
    let h = held_behind(QueuePolicy {
        allow_timeout_override: true,
        ..Default::default()
    });
    h.send("patient", 1, serde_json::json!({"timeout": u64::MAX}))
        .unwrap();
    h.send("hasty", 1, serde_json::json!({"timeout": 50_000}))
        .unwrap();
    let (id, r) = h.result();
    assert_eq!(id, "hasty");
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Unavailable);
    h.release();
    assert_eq!(
        h.outcomes(2),
        vec![("hold".into(), true), ("patient".into(), true)]
    );
}

/// Deadlines out of queue order, passing in the middle of the queue: the timed-out requests
/// leave (REJECT) or go behind the rest in their own order (DELAY), and the rest keep theirs.
#[test]
fn timed_out_requests_leave_the_middle_of_the_queue_and_the_rest_keep_their_order() {
    use wisp_core::config::TimeoutAction;
    for action in [TimeoutAction::Reject, TimeoutAction::Delay] {
        let h = held_behind(QueuePolicy {
            timeout_action: action,
            default_timeout_microseconds: 5_000_000,
            allow_timeout_override: true,
            ..Default::default()
        });
        for (id, timeout) in [("a", 0), ("b", 30_000), ("c", 0), ("d", 20_000), ("e", 0)] {
            h.send(id, 1, serde_json::json!({ "timeout": timeout }))
                .unwrap();
        }
        assert!(out_of_order(&h.s));
        std::thread::sleep(Duration::from_millis(100));
        if action == TimeoutAction::Reject {
            // Answered by the timeout thread while the instance is held.
            assert_eq!(
                h.outcomes(2),
                vec![("b".into(), false), ("d".into(), false)]
            );
            assert!(
                !out_of_order(&h.s),
                "what is left takes the default timeout"
            );
        }
        h.release();
        let mut served = Vec::new();
        let expected: &[&str] = match action {
            TimeoutAction::Reject => &["a", "c", "e"],
            TimeoutAction::Delay => &["a", "c", "e", "b", "d"],
        };
        for _ in expected {
            served.extend(h.batch_started());
        }
        assert_eq!(served, expected, "{action:?}");
        assert_eq!(h.outcomes(expected.len() + 1).len(), expected.len() + 1);
        assert_eq!(shapes_counted(&h.s), (0, 0));
    }
}

/// Whether the default level's queue has a deadline out of queue order.
fn out_of_order(s: &Scheduler) -> bool {
    s.shared.state.lock().unwrap().levels[0].out_of_order
}

/// DELAY needs no timeout thread (a delayed request is only reordered, which matters once an
/// instance is free), and neither does a policy without timeouts.
#[test]
fn only_reject_timeouts_start_a_timeout_thread() {
    let delay = queued(
        1,
        QueuePolicy {
            timeout_action: wisp_core::config::TimeoutAction::Delay,
            default_timeout_microseconds: 1000,
            allow_timeout_override: true,
            ..Default::default()
        },
    );
    assert!(delay.s.timeouts.lock().unwrap().is_none());
    let none = queued(1, QueuePolicy::default());
    assert!(none.s.timeouts.lock().unwrap().is_none());
    let overridable = queued(
        1,
        QueuePolicy {
            allow_timeout_override: true,
            ..Default::default()
        },
    );
    assert!(overridable.s.timeouts.lock().unwrap().is_some());
    overridable.s.stop();
    assert!(overridable.s.timeouts.lock().unwrap().is_none(), "joined");
}

/// What an instance waiting for a fuller batch (a 1 s queue delay) wakes for, with a request
/// queued whose 50 ms queue timeout takes `action`, as (the deadline it waits for, measured from
/// just before the request was sent).
fn instance_waits_for(action: wisp_core::config::TimeoutAction) -> Duration {
    let h = harness(
        policy(
            8,
            dynamic(|d| {
                d.max_queue_delay_microseconds = 1_000_000;
                d.default_queue_policy = Some(QueuePolicy {
                    timeout_action: action,
                    default_timeout_microseconds: 50_000,
                    ..Default::default()
                });
            }),
        ),
        1,
        "hold",
    );
    let sent = Instant::now();
    h.send("a", 1, serde_json::json!({})).unwrap();
    let mut state = h.s.shared.state.lock().unwrap();
    match h.s.shared.next(&mut state, Instant::now(), 0) {
        crate::Next::Wait(Some(t)) => t.saturating_duration_since(sent),
        _ => panic!("the instance waits for a fuller batch"),
    }
}

/// A REJECT deadline is the timeout thread's to answer: an idle instance waits only for what
/// it serves (here the batch delay). A DELAY deadline it wakes for, to reorder its queue.
#[test]
fn idle_instances_leave_reject_deadlines_to_the_timeout_thread() {
    use wisp_core::config::TimeoutAction;
    let reject = instance_waits_for(TimeoutAction::Reject);
    assert!(reject >= Duration::from_millis(900), "{reject:?}");
    let delay = instance_waits_for(TimeoutAction::Delay);
    assert!(delay < Duration::from_millis(900), "{delay:?}");
}

/// The queue keeps a lower bound on its earliest deadline, which goes stale when the request
/// that set it is dispatched in time: a later deadline behind it must still be enforced.
#[test]
fn a_deadline_behind_one_dispatched_in_time_still_expires() {
    let h = held_behind(QueuePolicy {
        allow_timeout_override: true,
        ..Default::default()
    });
    // "hold-2" sets the earliest deadline and is dispatched before it (and held, by its name);
    // "late" waits behind it, past its own deadline, and the request after it is in time.
    h.send("hold-2", 1, serde_json::json!({"timeout": 300_000}))
        .unwrap();
    h.send("late", 1, serde_json::json!({"timeout": 400_000}))
        .unwrap();
    h.send("on-time", 1, serde_json::json!({})).unwrap();
    h.release();
    assert_eq!(h.result().0, "hold");
    assert_eq!(h.batch_started(), vec!["hold-2"]);
    std::thread::sleep(Duration::from_millis(600));
    h.release();
    let got = h.outcomes(3);
    assert_eq!(
        got,
        vec![
            ("hold-2".into(), true),
            ("late".into(), false),
            ("on-time".into(), true)
        ]
    );
    assert_eq!(h.s.stats().failures(FailReason::Rejected), 1);
}

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
}

type Ran = Receiver<(String, std::thread::ThreadId)>;

fn here(policy: Policy, on_caller: bool) -> (Arc<Scheduler>, Ran, Sender<()>) {
    let (ran_tx, ran) = channel();
    let (permit, permits) = channel();
    let inst = Here {
        ran: ran_tx,
        permits: Arc::new(Mutex::new(permits)),
        on_caller,
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
