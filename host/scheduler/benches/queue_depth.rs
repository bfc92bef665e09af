//! Dispatch cost against queue depth: `depth` requests queue behind a held instance, which is
//! then released; the time to drain the queue, divided by `depth`, is what each dispatch costs
//! the instance thread (under the scheduler lock) once the queue is deep. Flat across depths is
//! the goal; growth with depth means a scan of the whole queue per dispatch. The cases with many
//! shapes show the same for batches that must look past other shapes for their own, and the
//! mean batch size says what the batcher made of such a queue.
//!
//! `cargo bench -p wisp-scheduler --bench queue_depth -- [--rounds N] [--label TEXT]`, or
//! `./dev bench queue`. Prints a Markdown table of medians.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_core::backend::{ExecTiming, Instance};
use wisp_core::config::{DynamicBatching, ModelConfig, QueuePolicy};
use wisp_core::{DataType, InferRequest, InferResponse, Result, Tensor};
use wisp_scheduler::{Policy, Scheduler};

/// Holds its first batch until released, then answers at once.
struct HeldOnce {
    started: Sender<()>,
    release: Option<Receiver<()>>,
    /// Batches executed.
    batches: Arc<AtomicUsize>,
}

impl Instance for HeldOnce {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _t: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        if let Some(release) = self.release.take() {
            let _ = self.started.send(());
            let _ = release.recv_timeout(Duration::from_secs(60));
        }
        batch.iter().map(|_| Ok(InferResponse::default())).collect()
    }
}

struct Case {
    name: &'static str,
    max_batch_size: i32,
    dynamic: bool,
    timeout: bool,
    /// How many distinct shapes the requests have, interleaved (as variable-length inputs
    /// arrive), so that a batch must look past other shapes for its own.
    shapes: usize,
}

fn policy(c: &Case) -> Policy {
    let queue = c.timeout.then(|| QueuePolicy {
        // Long enough that nothing expires: only the cost of having deadlines is measured.
        default_timeout_microseconds: 600_000_000,
        ..Default::default()
    });
    let cfg = ModelConfig {
        max_batch_size: c.max_batch_size,
        dynamic_batching: c.dynamic.then(|| DynamicBatching {
            default_queue_policy: queue,
            ..Default::default()
        }),
        ..Default::default()
    };
    Policy::from_config(&cfg, None)
}

/// Request `i` of a case with `shapes` shapes: `[1, 1]` when there is one shape, else
/// `[1, 1 + i % shapes, 0]` (zero-sized, so that many shapes cost no memory).
fn request(i: usize, shapes: usize) -> InferRequest {
    let (shape, data) = if shapes == 1 {
        (vec![1, 1], 1.0f32.to_le_bytes().to_vec())
    } else {
        (vec![1, 1 + (i % shapes) as i64, 0], Vec::new())
    };
    InferRequest {
        inputs: vec![Tensor::new("x", DataType::Fp32, shape, data.into()).expect("tensor")],
        ..Default::default()
    }
}

/// Seconds to drain `depth` queued requests (plus the held one), and the batches they took.
fn drain(c: &Case, depth: usize) -> (f64, usize) {
    let (started_tx, started) = channel();
    let (release_tx, release) = channel();
    let batches = Arc::new(AtomicUsize::new(0));
    let inst = HeldOnce {
        started: started_tx,
        release: Some(release),
        batches: batches.clone(),
    };
    let s = Scheduler::start("bench", policy(c), vec![Box::new(inst)], None).expect("start");
    let answered = Arc::new(AtomicUsize::new(0));
    let (done_tx, done) = channel();
    let total = depth + 1;
    let submit = |s: &Scheduler, i: usize| {
        let answered = answered.clone();
        let done_tx = done_tx.clone();
        s.enqueue(
            request(i, c.shapes),
            Box::new(move |r| {
                r.expect("answered");
                if answered.fetch_add(1, Ordering::SeqCst) + 1 == total {
                    let _ = done_tx.send(());
                }
            }),
        )
        .expect("queued");
    };
    submit(&s, 0);
    started
        .recv_timeout(Duration::from_secs(60))
        .expect("the held batch starts");
    for i in 0..depth {
        submit(&s, i);
    }
    let t = Instant::now();
    release_tx.send(()).expect("release");
    done.recv_timeout(Duration::from_secs(120))
        .expect("the queue drains");
    let secs = t.elapsed().as_secs_f64();
    (secs, batches.load(Ordering::Relaxed) - 1)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut rounds = 5usize;
    let mut label = String::from("this build");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| (1..=50).contains(&n))
                    .expect("--rounds takes 1..=50");
            }
            "--label" => label = args.next().expect("--label takes a value"),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    let cases = [
        Case {
            name: "no batching",
            max_batch_size: 0,
            dynamic: false,
            timeout: false,
            shapes: 1,
        },
        Case {
            name: "dynamic, batch 8",
            max_batch_size: 8,
            dynamic: true,
            timeout: false,
            shapes: 1,
        },
        Case {
            name: "dynamic, batch 8, queue timeout",
            max_batch_size: 8,
            dynamic: true,
            timeout: true,
            shapes: 1,
        },
        Case {
            name: "dynamic, batch 8, 1000 interleaved shapes",
            max_batch_size: 8,
            dynamic: true,
            timeout: false,
            shapes: 1000,
        },
        Case {
            name: "dynamic, batch 8, every request its own shape",
            max_batch_size: 8,
            dynamic: true,
            timeout: false,
            shapes: usize::MAX,
        },
    ];
    println!("## queue depth ({label}): medians of {rounds} round(s)\n");
    println!("| case | depth | drain ms | ns per request | requests per batch |");
    println!("|---|---|---|---|---|");
    for c in &cases {
        for depth in [256usize, 4096, 16384] {
            let runs: Vec<(f64, usize)> = (0..rounds).map(|_| drain(c, depth)).collect();
            let secs = median(runs.iter().map(|r| r.0).collect());
            let batches = median(runs.iter().map(|r| r.1 as f64).collect());
            println!(
                "| {} | {depth} | {:.2} | {:.0} | {:.2} |",
                c.name,
                secs * 1e3,
                secs * 1e9 / depth as f64,
                depth as f64 / batches.max(1.0)
            );
        }
    }
}
