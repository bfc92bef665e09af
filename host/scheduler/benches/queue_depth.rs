//! Dispatch cost against queue depth: `depth` requests queue behind a held instance, which is
//! then released; the time to drain the queue, divided by `depth`, is what each dispatch costs
//! the instance thread (under the scheduler lock) once the queue is deep. Flat across depths is
//! the goal; growth with depth means a scan of the whole queue per dispatch. The cases with many
//! shapes show the same for batches that must look past other shapes for their own, and the
//! mean batch size says what the batcher made of such a queue.
//!
//! A second table measures the timeout thread: `depth` requests queue behind a held instance,
//! with REJECT deadlines spread over 100 ms, either in queue order (every request's timeout
//! is as long, the usual case) or reversed (each request asks for a shorter timeout than the
//! one before it). It gives the thread's CPU time until all were answered: in order, the
//! timed-out requests leave from the front of the queue; reversed, each expiry scans the queue.
//! Separate rounds time another client's `enqueue` calls while the deadlines pass: a scan holds
//! the scheduler lock, which they wait for.
//!
//! `cargo bench -p wisp-scheduler --bench queue_depth -- [--rounds N] [--label TEXT]`, or
//! `./dev bench queue`. Prints Markdown tables of medians.

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

/// CPU time of this process's thread named `name` (as Linux keeps it: at most 15 bytes), in
/// nanoseconds, from `/proc/self/task/*/schedstat`. A thread names itself as it starts, so a
/// thread just spawned is waited for (up to a second).
fn thread_cpu_ns(name: &str) -> u64 {
    let name = &name[..name.len().min(15)];
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end() == name {
                let stat = std::fs::read_to_string(t.path().join("schedstat")).expect("schedstat");
                return stat
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("schedstat's first field");
            }
        }
        assert!(Instant::now() < until, "no thread named {name}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Over how long the deadlines of one timeout round pass.
const SPREAD: Duration = Duration::from_millis(100);

/// How often the prober enqueues while deadlines pass.
const PROBE_EVERY: Duration = Duration::from_micros(200);

/// What one timeout round measured.
struct Expiry {
    /// The timeout thread's CPU milliseconds.
    cpu_ms: f64,
    /// How long each of the prober's `enqueue` calls took while the deadlines passed, in µs
    /// (empty without a prober).
    enqueue_us: Vec<f64>,
}

/// The timeout thread's CPU milliseconds to answer `depth` requests whose REJECT deadlines
/// pass over [`SPREAD`] while the only instance is held: in queue order, or reversed. With
/// `probe`, another thread enqueues a request every [`PROBE_EVERY`] while they pass, and times
/// each call: what the scans cost other clients, who wait for the lock while one runs (its
/// requests queue behind the rest, with a later deadline than all of them, so they change no
/// order and never time out).
fn expire(depth: usize, ordered: bool, probe: bool) -> Expiry {
    let (started_tx, started) = channel();
    let (release_tx, release) = channel();
    let inst = HeldOnce {
        started: started_tx,
        release: Some(release),
        batches: Arc::new(AtomicUsize::new(0)),
    };
    let cfg = ModelConfig {
        max_batch_size: 8,
        dynamic_batching: Some(DynamicBatching {
            default_queue_policy: Some(QueuePolicy {
                allow_timeout_override: true,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let policy = Policy::from_config(&cfg, None);
    let s = Scheduler::start("bench", policy, vec![Box::new(inst)], None).expect("start");
    s.enqueue(request(0, 1), Box::new(|_| {})).expect("queued");
    started
        .recv_timeout(Duration::from_secs(60))
        .expect("the held batch starts");
    let answered = Arc::new(AtomicUsize::new(0));
    let (done_tx, done) = channel();
    let before = thread_cpu_ns("wisp-bench-timeouts");
    // The first deadline passes well after the last request is queued.
    let base = Duration::from_millis(200);
    let first_deadline = Instant::now() + base;
    for i in 0..depth {
        let k = if ordered { i } else { depth - 1 - i };
        let mut r = request(i, 1);
        r.scheduling.timeout_us = (base + SPREAD * k as u32 / depth as u32).as_micros() as u64;
        let answered = answered.clone();
        let done_tx = done_tx.clone();
        s.enqueue(
            r,
            Box::new(move |r| {
                assert!(r.is_err(), "timed out");
                if answered.fetch_add(1, Ordering::SeqCst) + 1 == depth {
                    let _ = done_tx.send(());
                }
            }),
        )
        .expect("queued");
    }
    let finished = std::sync::atomic::AtomicBool::new(false);
    let enqueue_us = std::thread::scope(|scope| {
        let prober = probe.then(|| {
            scope.spawn(|| {
                let mut took = Vec::new();
                std::thread::sleep(first_deadline.saturating_duration_since(Instant::now()));
                // Bounded: the deadlines pass over SPREAD, and the wait below is 120 s at most.
                while !finished.load(Ordering::SeqCst) && took.len() < 1_000_000 {
                    let mut r = request(0, 1);
                    r.scheduling.timeout_us = 600_000_000;
                    let t = Instant::now();
                    s.enqueue(r, Box::new(|_| {})).expect("queued");
                    took.push(t.elapsed().as_secs_f64() * 1e6);
                    std::thread::sleep(PROBE_EVERY);
                }
                took
            })
        });
        let all = done.recv_timeout(Duration::from_secs(120));
        finished.store(true, Ordering::SeqCst);
        all.expect("every request times out");
        prober
            .map(|p| p.join().expect("prober"))
            .unwrap_or_default()
    });
    let cpu = thread_cpu_ns("wisp-bench-timeouts") - before;
    release_tx.send(()).expect("release");
    Expiry {
        cpu_ms: cpu as f64 / 1e6,
        enqueue_us,
    }
}

/// The `p`-th percentile of `v` (0 when empty).
fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
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
    println!(
        "\n## REJECT deadlines passing over {} ms behind a held instance ({label}): medians of {rounds} round(s)\n",
        SPREAD.as_millis()
    );
    println!(
        "The enqueue columns come from separate rounds with a prober enqueuing every {} µs while the deadlines pass: medians over rounds of each round's p50, p99 and maximum.\n",
        PROBE_EVERY.as_micros()
    );
    println!(
        "| deadlines | depth | timeout thread CPU ms | enqueue p50 µs | enqueue p99 µs | enqueue max µs |"
    );
    println!("|---|---|---|---|---|---|");
    for ordered in [true, false] {
        for depth in [4096usize, 16384] {
            let cpu = median(
                (0..rounds)
                    .map(|_| expire(depth, ordered, false).cpu_ms)
                    .collect(),
            );
            let mut p50 = Vec::new();
            let mut p99 = Vec::new();
            let mut max = Vec::new();
            for _ in 0..rounds {
                let mut e = expire(depth, ordered, true).enqueue_us;
                p50.push(percentile(&mut e, 0.5));
                p99.push(percentile(&mut e, 0.99));
                max.push(percentile(&mut e, 1.0));
            }
            let order = if ordered {
                "in queue order"
            } else {
                "reversed"
            };
            println!(
                "| {order} | {depth} | {cpu:.2} | {:.1} | {:.1} | {:.1} |",
                median(p50),
                median(p99),
                median(max)
            );
        }
    }
}
