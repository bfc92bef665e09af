//! Queue timeouts: REJECT and DELAY, the timeout thread, and deadlines out of order.

use super::*;

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
        crate::dispatch::Next::Wait(Some(t)) => t.saturating_duration_since(sent),
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
