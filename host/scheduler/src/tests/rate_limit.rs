//! Two models whose instances share a rate-limiter resource never execute at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::{InferRequest, InferResponse, Result};

use super::{policy, req, WAIT};
use crate::rate_limit::{Needs, RateLimiter};
use crate::Scheduler;

/// Echoes its inputs after 10 ms, counting how many of its kind execute at once.
struct Counting {
    running: Arc<AtomicUsize>,
    widest: Arc<AtomicUsize>,
}

impl Instance for Counting {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.widest.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(10));
        self.running.fetch_sub(1, Ordering::SeqCst);
        batch
            .iter()
            .map(|r| Ok(InferResponse::new(r.inputs.clone())))
            .collect()
    }
}

/// Runs 6 requests on each of two 2-instance models at once; returns the most instances that
/// executed at the same time.
fn widest(limiter: Option<Arc<RateLimiter>>) -> usize {
    let running = Arc::new(AtomicUsize::new(0));
    let widest = Arc::new(AtomicUsize::new(0));
    let models: Vec<Scheduler> = ["cheap", "heavy"]
        .iter()
        .map(|name| {
            let instances = (0..2)
                .map(|_| {
                    Box::new(Counting {
                        running: running.clone(),
                        widest: widest.clone(),
                    }) as Box<dyn Instance>
                })
                .collect();
            let s = Scheduler::start(name, policy(0, None), instances, None).unwrap();
            if let Some(l) = &limiter {
                let needs = Needs {
                    resources: vec![("CORE".into(), 1)],
                    priority: 1,
                };
                l.check(name, &needs).unwrap();
                s.set_rate_limits(l.clone(), vec![needs]);
            }
            s
        })
        .collect();
    let (tx, rx) = channel();
    for i in 0..6 {
        for s in &models {
            let tx = tx.clone();
            s.enqueue(
                req(&format!("r{i}"), 1, serde_json::json!({})),
                Box::new(move |r| tx.send(r.is_ok()).unwrap()),
            )
            .unwrap();
        }
    }
    for _ in 0..12 {
        assert!(rx.recv_timeout(WAIT).unwrap(), "every request is answered");
    }
    widest.load(Ordering::SeqCst)
}

#[test]
fn instances_sharing_a_resource_take_turns_across_models() {
    let limiter = RateLimiter::new(HashMap::from([("CORE".to_string(), 1)]));
    assert_eq!(widest(Some(limiter)), 1);
    // the same load without the limiter runs them side by side (the test can fail)
    assert!(widest(None) >= 2);
}

/// A request waiting for its instance's resources is still queued: its REJECT queue timeout
/// (300 ms) answers it, instead of it running when the resources come back a second later.
#[test]
fn a_queue_timeout_applies_while_waiting_for_resources() {
    use super::{dynamic, QueuePolicy};
    let limiter = RateLimiter::new(HashMap::from([("CORE".to_string(), 1)]));
    let running = Arc::new(AtomicUsize::new(0));
    let widest = Arc::new(AtomicUsize::new(0));
    let instance = Box::new(Counting {
        running: running.clone(),
        widest: widest.clone(),
    }) as Box<dyn Instance>;
    let queue = QueuePolicy {
        default_timeout_microseconds: 300_000,
        ..Default::default()
    };
    let s = Scheduler::start(
        "limited",
        policy(4, dynamic(|d| d.default_queue_policy = Some(queue))),
        vec![instance],
        None,
    )
    .unwrap();
    let needs = Needs {
        resources: vec![("CORE".into(), 1)],
        priority: 1,
    };
    limiter.check("limited", &needs).unwrap();
    s.set_rate_limits(limiter.clone(), vec![needs.clone()]);
    // Another model's instance holds the only CORE for a second.
    let taken = limiter.acquire(usize::MAX, &needs);
    let (tx, rx) = channel();
    let started = std::time::Instant::now();
    s.enqueue(
        req("late", 1, serde_json::json!({})),
        Box::new(move |r| tx.send(r).unwrap()),
    )
    .unwrap();
    let answer = rx.recv_timeout(WAIT).unwrap();
    let waited = started.elapsed();
    drop(taken);
    let Err(e) = answer else {
        panic!("the request ran: it should have been rejected in the queue");
    };
    assert!(e.message().contains("Request timeout expired"), "{e}");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(900),
        "answered after {waited:?}"
    );
    assert_eq!(widest.load(Ordering::SeqCst), 0, "it never ran");
    assert_eq!(s.stats().failures(crate::FailReason::Rejected), 1);
}
