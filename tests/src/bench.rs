//! `wisp-bench` (run by `./dev bench`): suites that each measure side by side in one run:
//!
//! - `http`: the server over HTTP with binary tensors vs the same backend called in-process with
//!   no server (the limit), for the tiny `add_sub` and the MobileNet-class PP-OCR direction
//!   classifier of `model_repo/`, at concurrency 1, 4, 16; and, per model, the same client's
//!   `GET /v2/health/live` at concurrency 1, the floor any request over HTTP pays here.
//! - `batching`: the PP-OCR classifier over HTTP binary at concurrency 1, 8, 32 with (a) no
//!   batching and one instance, (b) the dynamic batcher, against (c) the backend in-process at
//!   its best batch size.
//!
//! - `grpc`: HTTP (binary tensors) vs gRPC (`raw_input_contents`) on both models at concurrency
//!   1, 8, 32, with lean clients for both (see `lean`); with `--client-thread`, also the
//!   server's CPU time per request for each.
//! - `swap`: the longest gap in service while a model is reloaded several times under a client
//!   loop, against the longest gap without reloads.
//! - `plugins`: (a) an identity wasm plugin vs an identity ONNX model served side by side over
//!   HTTP at concurrency 1 and 8; (b) `image-preprocess` on a 224×224 image as a wasm instance
//!   vs the same Rust function called natively; (c) plugin compile times cold and from the
//!   on-disk cache, and instantiate (+ `init`) time.
//! - `pipelines`: the `text_direction` ensemble and its BLS twin, and the `content_type`
//!   ensemble, each vs each of its steps alone (and text direction vs doing pre/post-processing
//!   in the client), at concurrency 1, 8, 32, on a real image and a real file.
//!
//! - `sequence`: sequence batching (`oldest`) on the `accumulate` fixture at 8 and 32
//!   concurrent sequences of 10 requests each, against the same model served stateless with
//!   the client carrying the state itself (the work without the sequence batcher).
//!
//! - `shm`: a 4 MB FP32 input (and its 4 MB output) through an identity model, as binary HTTP
//!   vs in system shared memory regions the client created (the client still reads its output
//!   back), at concurrency 1 and 8.
//!
//! - `trace`: `add_sub` over HTTP with tracing off vs every request traced (`trace_rate 1`,
//!   written every 1000 traces), same server, settings switched between runs, at
//!   concurrency 1 and 8, three alternating rounds.
//!
//! - `languages` (not in the default set): the same add/sub step on 16 floats as a Rust, a
//!   Python and a JavaScript plugin (and the ONNX `add_sub` for reference): (a) per-call cost
//!   of one instance in-process, (b) over HTTP at concurrency 1 and 8, (c) component size,
//!   cold compile and load from the cache; (d) a BLS plugin forwarding to `add_sub` with its
//!   whole batch in one `models` call vs one call per request, at concurrency 8 and 32.
//!
//! - `embeddings` (not in the default set): all-MiniLM-L6-v2 text embeddings through
//!   `/v1/embeddings`, the `text_embedding` ensemble, the encoder alone pre-tokenized, and the
//!   same pipeline in one Python process, at concurrency 1, 8, 32; the tokenizer step in wasm
//!   vs native (see `embeddings.rs`).
//!
//! - `soak` (not in the default set): the release `wisp` in its own process under mixed good,
//!   bad and slow traffic with periodic reloads for `--soak-minutes`; RSS, p50 and p99 per
//!   minute (see `soak.rs`).
//!
//! Every loop is bounded by time and count; traffic is loopback only.

mod embeddings;
mod grpc_suite;
mod http_suites;
mod language_suites;
mod pipeline_suites;
mod plugin_suites;
mod shm_sequence_suites;
mod soak;
mod soak_attackers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::Parser;
use wisp_backend_onnx::{find_onnxruntime, EngineChoice, OnnxBackend, ProcessEnv};
use wisp_core::backend::Backend;
use wisp_core::repository::ModelDir;
use wisp_core::{DataType, InferRequest, Tensor};
use wisp_server::models::{model_file, prepare_config};
use wisp_server::settings::{OnnxEngine, Settings};
use wisp_server::Server;
use wisp_tests::{binary_request, bytes_element, f32_bytes, workspace_root, Client};

use grpc_suite::grpc_suite;
use http_suites::{batching_suite, http_suite, swap_suite};
use language_suites::languages_suite;
use pipeline_suites::{pipelines_suite, trace_suite};
use plugin_suites::plugins_suite;
use shm_sequence_suites::{sequence_suite, shm_suite};

#[derive(Parser)]
struct Args {
    /// Suites to run: http, batching, grpc, swap, plugins (default all).
    #[arg(
        value_delimiter = ',',
        default_value = "http,batching,grpc,swap,plugins"
    )]
    suites: Vec<String>,
    /// ONNX engine: onnxruntime or tract.
    #[arg(long, default_value = "onnxruntime")]
    engine: String,
    /// Seconds measured per cell (after a warm-up of a quarter of that).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrency levels of the http suite.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// Concurrency levels of the batching suite.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batching_concurrency: Vec<usize>,
    /// Hard cap on requests per cell.
    #[arg(long, default_value_t = 200_000)]
    max_requests: usize,
    /// Length of the soak suite, in minutes.
    #[arg(long, default_value_t = 10.0)]
    soak_minutes: f64,
    /// Rounds of the grpc suite: each cell measures HTTP then gRPC this many times and reports
    /// the medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run the http and grpc suites' clients on a thread of their own (a single-threaded
    /// runtime), as a client in another process would be, instead of on the server's workers.
    #[arg(long)]
    client_thread: bool,
    /// Models of the grpc suite, by name (default both: add_sub, ppocr_cls).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Print on stderr, for each load of the grpc suite, when it ran and how many requests it
    /// sent (`phase PROTOCOL MODEL CONCURRENCY START END SENT`, times in seconds of
    /// CLOCK_MONOTONIC, the clock `perf record -k CLOCK_MONOTONIC` stamps samples with), so
    /// that a profile can be split by load (`benches/grpc_profile.py`).
    #[arg(long)]
    phases: bool,
}

impl Args {
    /// Runs a client load `fut` on the server's runtime `rt`, or on the clients' own thread
    /// with `--client-thread`.
    fn load<F: std::future::Future>(&self, rt: &tokio::runtime::Runtime, fut: F) -> F::Output {
        self.load_cpu(rt, fut).0
    }

    /// [`Args::load`], and the CPU time spent meanwhile by the rest of the process (the server:
    /// the process's CPU time less the clients' thread's) and by the clients' thread. Only with
    /// `--client-thread`: on a shared runtime the two cannot be told apart.
    fn load_cpu<F: std::future::Future>(
        &self,
        rt: &tokio::runtime::Runtime,
        fut: F,
    ) -> (F::Output, Option<Cpu>) {
        if self.client_thread {
            static CLIENT: std::sync::OnceLock<tokio::runtime::Runtime> =
                std::sync::OnceLock::new();
            let client = CLIENT.get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the clients' runtime")
            });
            let (process, thread) = (
                clock_now(libc::CLOCK_PROCESS_CPUTIME_ID),
                clock_now(libc::CLOCK_THREAD_CPUTIME_ID),
            );
            let out = client.block_on(fut);
            let process = clock_now(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(process);
            let thread = clock_now(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(thread);
            let server = process.saturating_sub(thread);
            (
                out,
                Some(Cpu {
                    server,
                    client: thread,
                }),
            )
        } else {
            (rt.block_on(fut), None)
        }
    }

    /// With `--phases`, prints on stderr that the grpc suite's load of `m` over `protocol` at
    /// concurrency `c`, begun at `start` (CLOCK_MONOTONIC), has ended, having sent `s.sent`.
    fn phase(&self, protocol: &str, m: &Model, c: usize, start: Duration, s: &Stats) {
        if self.phases {
            let end = clock_now(libc::CLOCK_MONOTONIC);
            eprintln!(
                "phase {protocol} {} {c} {:.6} {:.6} {}",
                m.name,
                start.as_secs_f64(),
                end.as_secs_f64(),
                s.sent
            );
        }
    }
}

/// CPU time (user and system) a load cost, split between the server and the clients.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    server: Duration,
    client: Duration,
}

/// The time now of `clock`: CPU time (user and system) so far of this process or this thread,
/// or CLOCK_MONOTONIC.
fn clock_now(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[expect(
        unsafe_code,
        reason = "clock_gettime fills the one timespec it is given"
    )]
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

struct Stats {
    rps: f64,
    p50: Duration,
    p99: Duration,
    /// Every request sent, warm-up included (what the CPU measured around a load paid for).
    sent: usize,
}

fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
    lat.sort_unstable();
    // (no request measured: zeros, not a panic)
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Stats {
        rps: lat.len() as f64 / wall.as_secs_f64(),
        p50: pick(0.5),
        p99: pick(0.99),
        sent: lat.len(),
    }
}

struct Model {
    name: &'static str,
    repo: PathBuf,
    input: Vec<(&'static str, &'static str, Vec<i64>, Vec<u8>)>,
}

fn models() -> Vec<Model> {
    let root = workspace_root();
    let row: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let image: Vec<u8> = (0..3 * 48 * 192)
        .flat_map(|i| (((i * 7919 % 255) as f32 / 127.5) - 1.0).to_le_bytes())
        .collect();
    vec![
        Model {
            name: "add_sub",
            repo: root.join("tests/fixtures/repo"),
            input: vec![
                ("INPUT0", "FP32", vec![1, 16], row.clone()),
                ("INPUT1", "FP32", vec![1, 16], row),
            ],
        },
        Model {
            name: "ppocr_cls",
            repo: root.join("model_repo"),
            input: vec![("x", "FP32", vec![1, 3, 48, 192], image)],
        },
    ]
}

/// The backend alone: one instance, called in a loop on this thread with `batch` requests per
/// execution (the server gives each of these models one instance too). Throughput counts
/// requests; latencies are per execution.
fn in_process(
    backend: &dyn Backend,
    name: &str,
    repo: &Path,
    input: &[(&'static str, &'static str, Vec<i64>, Vec<u8>)],
    batch: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let dir = ModelDir {
        name: name.into(),
        path: repo.join(name),
    };
    let spec = prepare_config(&dir, backend, true).map_err(|e| anyhow!("{e}"))?;
    let cfg = &*spec.config;
    let loaded = backend
        .load(&spec, &model_file(&dir.path, 1, cfg))
        .map_err(|e| anyhow!("{e}"))?;
    let mut inst = loaded.new_instance(0).map_err(|e| anyhow!("{e}"))?;
    let req = InferRequest {
        inputs: input
            .iter()
            .map(|(n, dt, s, d)| {
                Tensor::new(
                    *n,
                    DataType::parse(dt).unwrap(),
                    s.clone(),
                    d.clone().into(),
                )
            })
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("{e}"))?,
        ..Default::default()
    };
    let batch: Vec<InferRequest> = vec![req; batch];
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < secs / 4.0 {
        inst.execute(&batch, &mut Default::default());
    }
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs && lat.len() < cap {
        let t = Instant::now();
        let r = inst.execute(&batch, &mut Default::default());
        lat.push(t.elapsed());
        for x in r {
            x.map_err(|e| anyhow!("{e}"))?;
        }
    }
    let mut st = stats(lat, start.elapsed());
    st.rps *= batch.len() as f64;
    Ok(st)
}

async fn over_http(
    addr: std::net::SocketAddr,
    m: &Model,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let (body, n) = binary_request(&m.input, true);
    let headers = vec![("inference-header-content-length", n.to_string())];
    let path = format!("/v2/models/{}/infer", m.name);
    http_load(addr, "POST", path, headers, body.into(), conc, secs, cap).await
}

/// `conc` clients, each on its own keep-alive connection, sending `method path` back to back:
/// a quarter of `secs` to warm up, then up to `secs` (and `cap` requests in all) measured, each
/// answer required to be 200.
#[expect(
    clippy::too_many_arguments,
    reason = "one request and one load, spelled out"
)]
async fn http_load(
    addr: std::net::SocketAddr,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: bytes::Bytes,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let path = Arc::new(path);
    let headers = Arc::new(headers);
    let mut tasks = Vec::new();
    let per_task_cap = cap.div_ceil(conc);
    for _ in 0..conc {
        let (body, path, headers) = (body.clone(), path.clone(), headers.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let (warm, mut warmed) = (Instant::now(), 0);
            while warm.elapsed().as_secs_f64() < secs / 4.0 {
                c.send(method, &path, &headers, body.clone()).await?;
                warmed += 1;
            }
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                let t = Instant::now();
                let r = c.send(method, &path, &headers, body.clone()).await?;
                lat.push(t.elapsed());
                anyhow::ensure!(
                    r.status == 200,
                    "HTTP {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
            }
            Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
        }));
    }
    gather(tasks).await
}

/// Client tasks' latencies, measured times and warm-up request counts, merged: the wall time is
/// the longest task's.
type ClientTask = tokio::task::JoinHandle<anyhow::Result<(Vec<Duration>, Duration, usize)>>;

async fn gather(tasks: Vec<ClientTask>) -> anyhow::Result<Stats> {
    let (mut all, mut wall, mut warmed) = (Vec::new(), Duration::ZERO, 0);
    for t in tasks {
        let (lat, w, n) = t.await??;
        all.extend(lat);
        wall = wall.max(w);
        warmed += n;
    }
    let mut st = stats(all, wall);
    st.sent += warmed;
    Ok(st)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn start_server(
    rt: &tokio::runtime::Runtime,
    repo: &Path,
    engine: OnnxEngine,
) -> anyhow::Result<Server> {
    start_server_with(rt, repo, engine, |_| {})
}

/// [`start_server`] with `tweak` applied to the settings first.
fn start_server_with(
    rt: &tokio::runtime::Runtime,
    repo: &Path,
    engine: OnnxEngine,
    tweak: impl FnOnce(&mut Settings),
) -> anyhow::Result<Server> {
    let mut settings = Settings::for_repository(repo);
    settings.http_address = "127.0.0.1".parse()?;
    settings.http_port = 0;
    settings.metrics_port = 0;
    settings.grpc_port = 0;
    settings.onnx_engine = engine;
    settings.log_info = false;
    tweak(&mut settings);
    rt.block_on(Server::start(settings)).context("server start")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The median round trip of a message to a sleeping thread and back. A request crosses threads
/// several times (front end, scheduler, instance), so this floor sets much of the added latency
/// at concurrency 1; it varies between machines and virtual machines by 10× (5 µs on bare
/// metal, 50 µs on some VMs), so runs on different days compare through it.
fn wakeup_round_trip() -> Duration {
    let (to, from_main) = std::sync::mpsc::channel::<()>();
    let (back, from_echo) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        while from_main.recv().is_ok() {
            if back.send(()).is_err() {
                return;
            }
        }
    });
    let mut lat = Vec::with_capacity(2000);
    for i in 0..2000 {
        if i % 100 == 0 {
            // Let the echo thread go idle now and then, as an instance thread does.
            std::thread::sleep(Duration::from_micros(200));
        }
        let t = Instant::now();
        if to.send(()).is_err() || from_echo.recv().is_err() {
            break;
        }
        lat.push(t.elapsed());
    }
    lat.sort();
    lat.get(lat.len() / 2).copied().unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (engine, choice) = match args.engine.as_str() {
        "tract" => (OnnxEngine::Tract, EngineChoice::Tract),
        "onnxruntime" => (OnnxEngine::Onnxruntime, EngineChoice::OnnxRuntime),
        other => anyhow::bail!("unknown engine {other}"),
    };
    let lib = find_onnxruntime(None, &ProcessEnv);
    let backend = OnnxBackend::new(choice, lib).map_err(|e| anyhow!("{e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "wisp-bench: engine {}, {} s per cell, {} cores; this machine's thread wake-up round trip: p50 {:.1} µs\n",
        backend.engine(),
        args.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        wakeup_round_trip().as_secs_f64() * 1e6
    );
    for suite in &args.suites {
        match suite.as_str() {
            "http" => http_suite(&args, &rt, &backend, engine)?,
            "batching" => batching_suite(&args, &rt, &backend, engine)?,
            "grpc" => grpc_suite(&args, &rt, engine)?,
            "swap" => swap_suite(&args, &rt, engine)?,
            "plugins" => plugins_suite(&args, &rt, &backend, engine)?,
            "pipelines" => pipelines_suite(&args, &rt, engine)?,
            "sequence" => sequence_suite(&args, &rt, engine)?,
            "shm" => shm_suite(&args, &rt, engine)?,
            "trace" => trace_suite(&args, &rt, engine)?,
            "languages" => languages_suite(&args, &rt, &backend, engine)?,
            "embeddings" => embeddings::suite(&args, &rt, &backend, engine)?,
            "soak" => soak::soak(&rt, args.soak_minutes)?,
            other => {
                anyhow::bail!(
                    "unknown suite '{other}' (http, batching, grpc, swap, plugins, pipelines, sequence, shm, trace, languages, embeddings, soak)"
                )
            }
        }
    }
    Ok(())
}
