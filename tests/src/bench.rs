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
mod soak;

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

fn http_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    backend: &OnnxBackend,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    println!("## http: server over HTTP (binary tensors) vs the backend in-process\n");
    println!("| model | concurrency | in-process req/s | p50 µs | p99 µs | server req/s | p50 µs | p99 µs | server/in-process throughput | added p50 µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for m in models() {
        if !m.repo.join(m.name).is_dir() {
            anyhow::bail!(
                "{} missing: run ./dev bench (it fetches the demo models)",
                m.name
            );
        }
        let server = start_server(rt, &m.repo, engine)?;
        let addr = server.http_addr();
        let inproc = in_process(
            backend,
            m.name,
            &m.repo,
            &m.input,
            1,
            args.seconds,
            args.max_requests,
        )?;
        for &c in &args.concurrency {
            let s = args.load(rt, over_http(addr, &m, c, args.seconds, args.max_requests))?;
            println!(
                "| {} | {c} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} |",
                m.name,
                inproc.rps,
                us(inproc.p50),
                us(inproc.p99),
                s.rps,
                us(s.p50),
                us(s.p99),
                s.rps / inproc.rps,
                us(s.p50) - us(inproc.p50),
            );
        }
        // One client sending `GET /v2/health/live` back to back: the round trip that every
        // request over HTTP pays before any inference, here.
        let floor = args.load(
            rt,
            http_load(
                addr,
                "GET",
                "/v2/health/live".into(),
                Vec::new(),
                bytes::Bytes::new(),
                1,
                args.seconds,
                args.max_requests,
            ),
        )?;
        println!(
            "| {} | 1 | GET /v2/health/live, the protocol's floor | | | {:.0} | {:.0} | {:.0} | | |",
            m.name,
            floor.rps,
            us(floor.p50),
            us(floor.p99),
        );
        rt.block_on(server.shutdown())?;
    }
    println!();
    println!(
        "(the health rows: the same client and server answering `GET /v2/health/live` at \
         concurrency 1, the cost of HTTP, loopback TCP and the client themselves; an inference's \
         added p50 above that row's p50 is what the inference path adds)\n"
    );
    Ok(())
}

/// A copy of `model_repo/ppocr_cls` with `extra` config lines (instance count 1 throughout).
fn ppocr_variant(extra: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let m = dir.path().join("ppocr_cls");
    wisp_tests::copy_dir(&workspace_root().join("model_repo/ppocr_cls"), &m)?;
    let cfg = std::fs::read_to_string(m.join("config.pbtxt"))?;
    std::fs::write(m.join("config.pbtxt"), format!("{cfg}\n{extra}\n"))?;
    Ok(dir)
}

fn batching_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    backend: &OnnxBackend,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    let m = models()
        .into_iter()
        .find(|m| m.name == "ppocr_cls")
        .expect("ppocr model");
    println!("## batching: ppocr_cls over HTTP binary, one instance\n");
    // (c) the limit: in-process at each batch size, best throughput
    println!("in-process executions (requests per execution = batch):\n");
    println!("| batch | req/s | p50 µs per execution | p99 µs |");
    println!("|---|---|---|---|");
    let mut best: Option<(usize, Stats)> = None;
    let mut compute16 = Duration::ZERO;
    for b in [1usize, 2, 4, 8, 16] {
        let s = in_process(
            backend,
            m.name,
            &m.repo,
            &m.input,
            b,
            args.seconds,
            args.max_requests,
        )?;
        println!(
            "| {b} | {:.0} | {:.0} | {:.0} |",
            s.rps,
            us(s.p50),
            us(s.p99)
        );
        if b == 16 {
            compute16 = s.p50;
        }
        if best.as_ref().is_none_or(|(_, x)| s.rps > x.rps) {
            best = Some((b, s));
        }
    }
    let (best_b, best) = best.expect("measured");
    println!(
        "\n(c) best in-process: batch {best_b}, {:.0} req/s\n",
        best.rps
    );
    let plain = ppocr_variant("")?;
    let dynamic = ppocr_variant("dynamic_batching { }")?;
    let mut rows = Vec::new();
    for (label, repo) in [("a", plain.path()), ("b", dynamic.path())] {
        let server = start_server(rt, repo, engine)?;
        for &c in &args.batching_concurrency {
            let s = rt.block_on(over_http(
                server.http_addr(),
                &m,
                c,
                args.seconds,
                args.max_requests,
            ))?;
            rows.push((label, c, s));
        }
        rt.block_on(server.shutdown())?;
    }
    println!("| concurrency | (a) no batching req/s | p50 µs | p99 µs | (b) dynamic batching req/s | p50 µs | p99 µs | b/a | b/c | b p99 ÷ batch-16 compute |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &c in &args.batching_concurrency {
        let a = &rows.iter().find(|r| r.0 == "a" && r.1 == c).expect("a").2;
        let b = &rows.iter().find(|r| r.0 == "b" && r.1 == c).expect("b").2;
        println!(
            "| {c} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} |",
            a.rps,
            us(a.p50),
            us(a.p99),
            b.rps,
            us(b.p50),
            us(b.p99),
            b.rps / a.rps,
            b.rps / best.rps,
            b.p99.as_secs_f64() / compute16.as_secs_f64(),
        );
    }
    println!();
    Ok(())
}

/// The grpc suite's load: `conc` lean clients (see [`lean`]) of `m` over gRPC
/// (`raw_input_contents`) at `grpc`, or over HTTP with binary tensors at `http`, each on its own
/// connection, sending back to back: a quarter of `secs` to warm up, then up to `secs` (and
/// `cap` requests in all) measured.
async fn lean_load(
    target: Protocol,
    m: &Model,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    use wisp_server::grpc::pb;
    let grpc_body = {
        let req = pb::ModelInferRequest {
            model_name: m.name.into(),
            inputs: m
                .input
                .iter()
                .map(|(n, dt, s, _)| pb::model_infer_request::InferInputTensor {
                    name: n.to_string(),
                    datatype: dt.to_string(),
                    shape: s.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: m
                .input
                .iter()
                .map(|(_, _, _, d)| bytes::Bytes::from(d.clone()))
                .collect(),
            ..Default::default()
        };
        wisp_tests::grpc_frame(&req)
    };
    let (http_body, n) = binary_request(&m.input, true);
    let http_body = bytes::Bytes::from(http_body);
    let headers = Arc::new(vec![("inference-header-content-length", n.to_string())]);
    let path = Arc::new(format!("/v2/models/{}/infer", m.name));
    let per_task_cap = cap.div_ceil(conc);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (grpc_body, http_body, headers, path) = (
            grpc_body.clone(),
            http_body.clone(),
            headers.clone(),
            path.clone(),
        );
        // (the connection is polled in this task, so it wakes this task while it runs:
        // `Coalesce` keeps that wake from becoming a yield, as the server's connections do)
        tasks.push(tokio::spawn(wisp_server::coalesce::Coalesce::new(
            async move {
                enum C {
                    Http(lean::Http),
                    Grpc(lean::Grpc),
                }
                let mut c = match target {
                    Protocol::Http(a) => C::Http(lean::Http::connect(a).await?),
                    Protocol::Grpc(a) => C::Grpc(lean::Grpc::connect(a).await?),
                };
                let mut one = async || match &mut c {
                    C::Http(c) => c.post(&path, &headers, http_body.clone()).await,
                    C::Grpc(c) => c.unary("ModelInfer", grpc_body.clone()).await,
                };
                let (warm, mut warmed) = (Instant::now(), 0);
                while warm.elapsed().as_secs_f64() < secs / 4.0 {
                    one().await?;
                    warmed += 1;
                }
                let mut lat = Vec::new();
                let start = Instant::now();
                while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                    let t = Instant::now();
                    let r = one().await?;
                    lat.push(t.elapsed());
                    anyhow::ensure!(!r.is_empty(), "an empty response");
                }
                Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
            },
        )));
    }
    gather(tasks).await
}

/// Where [`lean_load`] sends its requests.
#[derive(Clone, Copy)]
enum Protocol {
    Http(std::net::SocketAddr),
    Grpc(std::net::SocketAddr),
}

/// The grpc suite's clients: each drives its own connection in the calling task (no connection
/// task to hand requests to, no task spawned per request), as a lean client in another process
/// would, so that the suite compares what the two protocols cost the server rather than what
/// hyper's clients cost (its HTTP/2 client spawns a task for every request body).
mod lean {
    use std::net::SocketAddr;
    use std::pin::Pin;

    use anyhow::{anyhow, Context};
    use bytes::{Bytes, BytesMut};
    use http_body_util::{BodyExt, Full};
    use hyper::http;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpStream;

    async fn tcp(addr: SocketAddr) -> anyhow::Result<TcpStream> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        tcp.set_nodelay(true)?;
        Ok(tcp)
    }

    /// HTTP/1.1 keep-alive on hyper's client connection, polled beside each request.
    pub struct Http {
        send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        conn: Pin<Box<hyper::client::conn::http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>>,
    }

    impl Http {
        pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
            let (send, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp(addr).await?)).await?;
            Ok(Http {
                send,
                conn: Box::pin(conn),
            })
        }

        /// `POST path` with `body`; the response body, required to be a 200's.
        pub async fn post(
            &mut self,
            path: &str,
            headers: &[(&str, String)],
            body: Bytes,
        ) -> anyhow::Result<Bytes> {
            let Http { send, conn } = self;
            let mut req = http::Request::post(path).header("host", "127.0.0.1");
            for (k, v) in headers {
                req = req.header(*k, v);
            }
            let req = req.body(Full::new(body))?;
            let call = async {
                std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
                let resp = send.send_request(req).await?;
                let status = resp.status();
                let body = resp.into_body().collect().await?.to_bytes();
                anyhow::ensure!(
                    status == 200,
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&body)
                );
                Ok(body)
            };
            beside(call, conn.as_mut()).await
        }
    }

    /// gRPC unary calls on `h2`'s client connection, polled beside each call. Each call's
    /// HEADERS and DATA frames go out in one write.
    pub struct Grpc {
        send: h2::client::SendRequest<Bytes>,
        conn: Pin<Box<h2::client::Connection<TcpStream, Bytes>>>,
    }

    impl Grpc {
        pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
            let (send, conn) = h2::client::handshake(tcp(addr).await?).await?;
            Ok(Grpc {
                send,
                conn: Box::pin(conn),
            })
        }

        /// Calls `/inference.GRPCInferenceService/<method>` with `framed` (a length-prefixed
        /// message); the response message's bytes, required to come with status OK.
        pub async fn unary(&mut self, method: &str, framed: Bytes) -> anyhow::Result<Bytes> {
            let Grpc { send, conn } = self;
            let req = wisp_tests::grpc_request(method).body(())?;
            let call = async {
                std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
                let (resp, mut stream) = send.send_request(req, false)?;
                stream.send_data(framed, true)?;
                let (parts, mut body) = resp.await?.into_parts();
                let mut msg = BytesMut::new();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk?;
                    body.flow_control().release_capacity(chunk.len())?;
                    msg.extend_from_slice(&chunk);
                }
                let trailers = body.trailers().await?.unwrap_or_default();
                let status = trailers
                    .get("grpc-status")
                    .or_else(|| parts.headers.get("grpc-status"));
                anyhow::ensure!(
                    parts.status == 200 && status.is_some_and(|s| s == "0"),
                    "gRPC call failed: HTTP {}, grpc-status {status:?}, grpc-message {:?}",
                    parts.status,
                    trailers.get("grpc-message")
                );
                anyhow::ensure!(msg.len() >= 5, "short gRPC response");
                Ok(msg.freeze().slice(5..))
            };
            beside(call, conn.as_mut()).await
        }
    }

    /// Runs `call` while polling its connection `conn` in the same task; a connection that
    /// ends first is an error.
    async fn beside<T, E: std::fmt::Debug>(
        call: impl std::future::Future<Output = anyhow::Result<T>>,
        conn: Pin<&mut impl std::future::Future<Output = Result<(), E>>>,
    ) -> anyhow::Result<T> {
        tokio::select! {
            biased;
            r = call => r,
            r = conn => Err(anyhow!("connection ended: {r:?}")),
        }
    }
}

fn grpc_suite(args: &Args, rt: &tokio::runtime::Runtime, engine: OnnxEngine) -> anyhow::Result<()> {
    let known = models();
    if let Some(unknown) = args
        .models
        .iter()
        .find(|n| !known.iter().any(|m| m.name == n.as_str()))
    {
        let names: Vec<&str> = known.iter().map(|m| m.name).collect();
        anyhow::bail!(
            "--models: no model named {unknown:?} in the grpc suite (it has: {})",
            names.join(", ")
        );
    }
    let rounds = args.rounds.max(1);
    println!(
        "## grpc: HTTP (binary tensors) vs gRPC (raw contents), same server, lean clients; \
         medians of {rounds} alternating round(s)\n"
    );
    println!("| model | concurrency | HTTP req/s | p50 µs | p99 µs | server CPU µs/req | client CPU µs/req | gRPC req/s | p50 µs | p99 µs | server CPU µs/req | client CPU µs/req | gRPC/HTTP throughput (range) | HTTP/gRPC server CPU (range) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Server and client CPU per request (every request sent, warm-up included), with
    // --client-thread.
    let per_req = |cpu: Option<Cpu>, s: &Stats| {
        let n = s.sent.max(1) as f64;
        cpu.map_or((f64::NAN, f64::NAN), |c| {
            (us(c.server) / n, us(c.client) / n)
        })
    };
    let wanted = |m: &Model| args.models.is_empty() || args.models.iter().any(|n| n == m.name);
    for m in known.into_iter().filter(wanted) {
        let server = start_server(rt, &m.repo, engine)?;
        let grpc = server.grpc_addr().expect("gRPC is on");
        for &c in &args.batching_concurrency {
            // One row per round: HTTP then gRPC, so that drifts in the machine hit both.
            let mut runs = Vec::new();
            for _ in 0..rounds {
                let start = clock_now(libc::CLOCK_MONOTONIC);
                let (h, h_cpu) = args.load_cpu(
                    rt,
                    lean_load(
                        Protocol::Http(server.http_addr()),
                        &m,
                        c,
                        args.seconds,
                        args.max_requests,
                    ),
                );
                let h = h?;
                args.phase("http", &m, c, start, &h);
                let start = clock_now(libc::CLOCK_MONOTONIC);
                let (g, g_cpu) = args.load_cpu(
                    rt,
                    lean_load(Protocol::Grpc(grpc), &m, c, args.seconds, args.max_requests),
                );
                let g = g?;
                args.phase("grpc", &m, c, start, &g);
                let (h_cpu, g_cpu) = (per_req(h_cpu, &h), per_req(g_cpu, &g));
                runs.push([
                    h.rps,
                    us(h.p50),
                    us(h.p99),
                    h_cpu.0,
                    h_cpu.1,
                    g.rps,
                    us(g.p50),
                    us(g.p99),
                    g_cpu.0,
                    g_cpu.1,
                    g.rps / h.rps,
                    h_cpu.0 / g_cpu.0,
                ]);
            }
            let col = |i: usize| {
                let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
                v.sort_by(f64::total_cmp);
                v
            };
            let median = |i: usize| col(i)[runs.len() / 2];
            let cpu = |i: usize| {
                let v = median(i);
                if v.is_nan() {
                    "—".to_string()
                } else {
                    format!("{v:.1}")
                }
            };
            let ratio = |i: usize| {
                let v = col(i);
                match (v.first(), v.last()) {
                    (Some(lo), Some(hi)) if !lo.is_nan() && !hi.is_nan() => {
                        format!("{:.2} ({lo:.2}–{hi:.2})", v[v.len() / 2])
                    }
                    _ => "—".to_string(),
                }
            };
            println!(
                "| {} | {c} | {:.0} | {:.0} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
                m.name,
                median(0),
                median(1),
                median(2),
                cpu(3),
                cpu(4),
                median(5),
                median(6),
                median(7),
                cpu(8),
                cpu(9),
                ratio(10),
                ratio(11),
            );
        }
        rt.block_on(server.shutdown())?;
    }
    println!();
    println!(
        "(each figure is the median over the rounds, the ratios' ranges are their lowest and \
         highest round; server CPU: the process's CPU time less the client thread's, and \
         client CPU: the client thread's, each over the whole load, warm-up included, per \
         request sent, only with --client-thread)\n"
    );
    Ok(())
}

/// Longest gap between consecutive completed requests (all clients merged) while `reloads`
/// reloads of `add_sub` happen (0 = the baseline), over HTTP with 4 clients.
async fn longest_gap(
    addr: std::net::SocketAddr,
    repo: &Path,
    reloads: usize,
    secs: f64,
) -> anyhow::Result<(Duration, usize)> {
    let m = models()
        .into_iter()
        .find(|m| m.name == "add_sub")
        .expect("add_sub");
    let (body, n) = binary_request(&m.input, true);
    let body = bytes::Bytes::from(body);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (body, stop) = (body.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let headers = [("inference-header-content-length", n.to_string())];
            let mut done = Vec::new();
            let start = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && done.len() < 200_000
                && start.elapsed().as_secs_f64() < secs * 4.0
            {
                let r = c
                    .send("POST", "/v2/models/add_sub/infer", &headers, body.clone())
                    .await?;
                anyhow::ensure!(
                    r.status == 200,
                    "request failed during reload: HTTP {}",
                    r.status
                );
                done.push(Instant::now());
            }
            Ok::<_, anyhow::Error>(done)
        }));
    }
    let mut admin = Client::connect(addr).await?;
    let started = Instant::now();
    for i in 0..reloads {
        tokio::time::sleep(Duration::from_secs_f64(secs / (reloads as f64 + 1.0))).await;
        let v = repo.join("add_sub").join((i + 2).to_string());
        wisp_tests::copy_dir(&repo.join("add_sub/1"), &v)?;
        let r = admin
            .send("POST", "/v2/repository/models/add_sub/load", &[], "")
            .await?;
        anyhow::ensure!(
            r.status == 200,
            "reload failed: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    while started.elapsed().as_secs_f64() < secs {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort();
    let gap = all
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    Ok((gap, all.len()))
}

fn swap_suite(args: &Args, rt: &tokio::runtime::Runtime, engine: OnnxEngine) -> anyhow::Result<()> {
    println!("## swap: longest gap in service (4 HTTP clients on add_sub)\n");
    println!("| run | reloads | requests served | longest gap µs |");
    println!("|---|---|---|---|");
    for reloads in [0usize, 5] {
        let dir = tempfile::tempdir()?;
        wisp_tests::copy_dir(
            &workspace_root().join("tests/fixtures/repo/add_sub"),
            &dir.path().join("add_sub"),
        )?;
        let server = start_server_with(rt, dir.path(), engine, |s| {
            s.model_control_mode = wisp_server::settings::ControlMode::Explicit;
            s.load_model = vec!["*".into()];
        })?;
        let (gap, n) = rt.block_on(longest_gap(
            server.http_addr(),
            dir.path(),
            reloads,
            args.seconds * 2.0,
        ))?;
        println!(
            "| {} | {reloads} | {n} | {:.0} |",
            if reloads == 0 {
                "baseline"
            } else {
                "reloading"
            },
            us(gap)
        );
        rt.block_on(server.shutdown())?;
    }
    println!();
    Ok(())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn plugins_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    backend: &OnnxBackend,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    use wisp_plugin_runtime::{WasmBackend, WasmOptions};
    use wisp_tests::add_plugin_model;

    let repo = tempfile::tempdir()?;
    let root = workspace_root();
    wisp_tests::copy_dir(
        &root.join("tests/fixtures/vision/identity"),
        &repo.path().join("identity_onnx"),
    )?;
    std::fs::write(
        repo.path().join("identity_onnx/config.pbtxt"),
        "max_batch_size: 8\ninstance_group [ { count: 2 } ]\n",
    )?;
    add_plugin_model(
        repo.path(),
        "identity_wasm",
        1,
        "testkit",
        r#"backend: "wasm"
max_batch_size: 8
instance_group [ { count: 2 } ]
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
"#,
    );
    add_plugin_model(
        repo.path(),
        "preprocess",
        1,
        "image-preprocess",
        r#"backend: "wasm"
max_batch_size: 8
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
"#,
    );

    println!(
        "## plugins (a): identity wasm plugin vs identity ONNX model, HTTP binary, FP32 [1,16]\n"
    );
    println!("| concurrency | ONNX req/s | p50 µs | p99 µs | wasm req/s | p50 µs | p99 µs | wasm/ONNX throughput | wasm − ONNX p50 µs |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let server = start_server(rt, repo.path(), engine)?;
    let row: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let onnx = Model {
        name: "identity_onnx",
        repo: repo.path().to_path_buf(),
        input: vec![("x", "FP32", vec![1, 16], row.clone())],
    };
    let wasm = Model {
        name: "identity_wasm",
        repo: repo.path().to_path_buf(),
        input: vec![("INPUT", "FP32", vec![1, 16], row)],
    };
    for c in [1usize, 8] {
        let o = rt.block_on(over_http(
            server.http_addr(),
            &onnx,
            c,
            args.seconds,
            args.max_requests,
        ))?;
        let w = rt.block_on(over_http(
            server.http_addr(),
            &wasm,
            c,
            args.seconds,
            args.max_requests,
        ))?;
        println!(
            "| {c} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:+.0} |",
            o.rps,
            us(o.p50),
            us(o.p99),
            w.rps,
            us(w.p50),
            us(w.p99),
            w.rps / o.rps,
            us(w.p50) - us(o.p50)
        );
    }
    rt.block_on(server.shutdown())?;

    println!("\n## plugins (b): image-preprocess, 224×224 → FP32 [1,3,224,224], wasm instance vs native\n");
    println!("| image | bytes | native p50 µs | wasm p50 µs | wasm p99 µs | wasm/native |");
    println!("|---|---|---|---|---|---|");
    let photo = |x: u32, y: u32| {
        let v = (x * 7 + y * 13) % 256;
        [v as u8, ((x * y) % 256) as u8, (255 - v) as u8]
    };
    let images = [
        ("JPEG q90", plugin_imaging::encode_jpeg(224, 224, 90, photo)),
        ("PNG", plugin_imaging::encode_png(224, 224, photo)),
    ];
    // Native and wasm calls alternate in one loop, so both see the same machine load.
    let wasm_backend = WasmBackend::new(WasmOptions::default(), None);
    let dir = ModelDir {
        name: "preprocess".into(),
        path: repo.path().join("preprocess"),
    };
    let spec = prepare_config(&dir, backend, true).map_err(|e| anyhow!("{e}"))?;
    let cfg = &*spec.config;
    let loaded = wasm_backend
        .load(&spec, &model_file(&dir.path, 1, cfg))
        .map_err(|e| anyhow!("{e}"))?;
    let mut inst = loaded.new_instance(0).map_err(|e| anyhow!("{e}"))?;
    let opts = plugin_imaging::Options::default();
    for (kind, bytes) in &images {
        let batch = [InferRequest {
            inputs: vec![Tensor::new(
                "IMAGE",
                DataType::Bytes,
                vec![1, 1],
                bytes_element(bytes).into(),
            )
            .map_err(|e| anyhow!("{e}"))?],
            ..Default::default()
        }];
        let mut one = |native: bool| -> anyhow::Result<Duration> {
            let t = Instant::now();
            if native {
                std::hint::black_box(
                    plugin_imaging::preprocess(bytes, &opts).map_err(|e| anyhow!(e.message))?,
                );
            } else {
                for r in inst.execute(&batch, &mut Default::default()) {
                    r.map_err(|e| anyhow!("{e}"))?;
                }
            }
            Ok(t.elapsed())
        };
        let warm = Instant::now();
        while warm.elapsed().as_secs_f64() < args.seconds / 4.0 {
            one(true)?;
            one(false)?;
        }
        let (mut nat, mut wasm) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < 2.0 * args.seconds && nat.len() < args.max_requests {
            nat.push(one(true)?);
            wasm.push(one(false)?);
        }
        let (native, w) = (stats(nat, start.elapsed()), stats(wasm, start.elapsed()));
        println!(
            "| {kind} | {} | {:.0} | {:.0} | {:.0} | {:.2} |",
            bytes.len(),
            us(native.p50),
            us(w.p50),
            us(w.p99),
            us(w.p50) / us(native.p50)
        );
    }

    println!("\n## plugins (c): compile and instantiate (medians of 5; instantiate of 50)\n");
    println!("| plugin | .wasm bytes | cold compile ms | load from cache ms | link µs | instantiate + init µs |");
    println!("|---|---|---|---|---|---|");
    for (model, plugin) in [
        ("identity_wasm", "testkit"),
        ("preprocess", "image-preprocess"),
    ] {
        let dir = ModelDir {
            name: model.into(),
            path: repo.path().join(model),
        };
        let spec = prepare_config(&dir, backend, true).map_err(|e| anyhow!("{e}"))?;
        let cfg = &*spec.config;
        let file = model_file(&dir.path, 1, cfg);
        let (mut cold, mut cached, mut link) = (Vec::new(), Vec::new(), Vec::new());
        let mut loaded = None;
        for _ in 0..5 {
            let cache = tempfile::tempdir()?;
            let options = || WasmOptions {
                cache_dir: Some(cache.path().to_path_buf()),
                ..Default::default()
            };
            let (_, t) = WasmBackend::new(options(), None)
                .load_timed(&spec, &file)
                .map_err(|e| anyhow!("{e}"))?;
            anyhow::ensure!(t.source == wisp_plugin_runtime::CompileSource::Compiled);
            cold.push(t.compile);
            let (m, t) = WasmBackend::new(options(), None)
                .load_timed(&spec, &file)
                .map_err(|e| anyhow!("{e}"))?;
            anyhow::ensure!(t.source == wisp_plugin_runtime::CompileSource::Cache);
            cached.push(t.compile);
            link.push(t.link);
            loaded = Some(m);
        }
        let loaded = loaded.expect("five loads");
        let mut inst = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            let i = wisp_core::backend::LoadedModel::new_instance(&loaded, 0)
                .map_err(|e| anyhow!("{e}"))?;
            inst.push(t.elapsed());
            drop(i);
        }
        println!(
            "| {plugin} | {} | {:.1} | {:.2} | {:.0} | {:.0} |",
            std::fs::metadata(&file)?.len(),
            median(cold).as_secs_f64() * 1e3,
            median(cached).as_secs_f64() * 1e3,
            us(median(link)),
            us(median(inst)),
        );
    }
    println!();
    Ok(())
}

async fn client_side_once(
    c: &mut Client,
    png: &[u8],
    opts: &plugin_imaging::Options,
) -> anyhow::Result<()> {
    let px = plugin_imaging::preprocess(png, opts).map_err(|e| anyhow!(e.message))?;
    let (body, n) = binary_request(&[("x", "FP32", vec![1, 3, 48, 192], f32_bytes(&px))], true);
    let r = c
        .send(
            "POST",
            "/v2/models/ppocr_cls/infer",
            &[("inference-header-content-length", n.to_string())],
            body,
        )
        .await?;
    anyhow::ensure!(r.status == 200, "HTTP {}", r.status);
    let n: usize = r.headers["inference-header-content-length"]
        .to_str()?
        .parse()?;
    let scores: Vec<f32> = r.body[n..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    std::hint::black_box(plugin_imaging::top_k(&scores, 1));
    Ok(())
}

/// Pre-processing in the client (the same Rust function the plugin runs), then `ppocr_cls`
/// over HTTP, then top-1 in the client: what a client does without server-side pipelines.
async fn client_side(
    addr: std::net::SocketAddr,
    png: Arc<Vec<u8>>,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let opts = Arc::new(plugin_imaging::Options {
        width: 192,
        height: 48,
        fit: plugin_imaging::Fit::PadRight,
        bgr: true,
        mean: [0.5; 3],
        std: [0.5; 3],
        ..Default::default()
    });
    let per_task_cap = cap.div_ceil(conc);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (png, opts) = (png.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let (warm, mut warmed) = (Instant::now(), 0);
            while warm.elapsed().as_secs_f64() < secs / 4.0 {
                client_side_once(&mut c, &png, &opts).await?;
                warmed += 1;
            }
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                let t = Instant::now();
                client_side_once(&mut c, &png, &opts).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
        }));
    }
    gather(tasks).await
}

/// One pipeline of the demo repository: its steps alone and its pipeline forms.
struct PipelineBench {
    title: String,
    steps: Vec<(String, Model)>,
    pipelines: Vec<(String, Model)>,
    /// Also measure pre/post-processing in the client (text direction only).
    client_side: Option<Arc<Vec<u8>>>,
}

/// A JSON array of numbers as little-endian bytes, each number converted by `le`.
fn json_le<const N: usize>(
    v: &serde_json::Value,
    le: fn(&serde_json::Value) -> [u8; N],
) -> Vec<u8> {
    v.as_array().into_iter().flatten().flat_map(le).collect()
}

/// Runs `model` once over HTTP with JSON outputs and returns output `name` as raw LE bytes.
fn output_bytes(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    m: &Model,
    name: &str,
    to_bytes: fn(&serde_json::Value) -> Vec<u8>,
) -> anyhow::Result<Vec<u8>> {
    let (body, n) = binary_request(&m.input, false);
    let r = rt.block_on(async {
        let mut c = Client::connect(addr).await?;
        c.send(
            "POST",
            &format!("/v2/models/{}/infer", m.name),
            &[("inference-header-content-length", n.to_string())],
            body,
        )
        .await
    })?;
    anyhow::ensure!(r.status == 200, "{}: HTTP {}", m.name, r.status);
    let j = r.json();
    let out = j["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["name"] == name))
        .ok_or_else(|| anyhow!("{} has no output {name}", m.name))?;
    Ok(to_bytes(&out["data"]))
}

/// One row of a pipelines table: what ran, at which concurrency, its throughput and latency.
fn pipeline_row(what: &str, concurrency: usize, s: &Stats) {
    println!(
        "| {what} | {concurrency} | {:.0} | {:.0} | {:.0} |",
        s.rps,
        us(s.p50),
        us(s.p99)
    );
}

fn pipelines_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    let root = workspace_root();
    let repo = root.join("model_repo");
    anyhow::ensure!(
        repo.join("text_direction_bls/1/model.wasm").is_file()
            && repo.join("magika_labels/1/model.wasm").is_file(),
        "model_repo plugins missing: run ./dev bench (it builds and installs them)"
    );
    let bytes_input =
        |name: &'static str, data: &[u8]| (name, "BYTES", vec![1i64, 1], bytes_element(data));
    let model =
        |name: &'static str, input: Vec<(&'static str, &'static str, Vec<i64>, Vec<u8>)>| Model {
            name,
            repo: repo.clone(),
            input,
        };
    let server = start_server(rt, &repo, engine)?;
    let addr = server.http_addr();

    let png = std::fs::read(root.join("tests/fixtures/images/text_upright.png"))?;
    let opts = plugin_imaging::Options {
        width: 192,
        height: 48,
        fit: plugin_imaging::Fit::PadRight,
        bgr: true,
        mean: [0.5; 3],
        std: [0.5; 3],
        ..Default::default()
    };
    let pixels =
        f32_bytes(&plugin_imaging::preprocess(&png, &opts).map_err(|e| anyhow!(e.message))?);
    let probs = f32_bytes(&[0.9, 0.1]);

    let file = std::fs::read(root.join("scripts/fetch_models.py"))?;
    let f32s =
        |v: &serde_json::Value| json_le(v, |x| (x.as_f64().unwrap_or(0.0) as f32).to_le_bytes());
    let i32s =
        |v: &serde_json::Value| json_le(v, |x| (x.as_i64().unwrap_or(0) as i32).to_le_bytes());
    let features = output_bytes(
        rt,
        addr,
        &model("magika_features", vec![bytes_input("CONTENT", &file)]),
        "FEATURES",
        i32s,
    )?;
    let scores = output_bytes(
        rt,
        addr,
        &model(
            "magika",
            vec![("bytes", "INT32", vec![1, 2048], features.clone())],
        ),
        "target_label",
        f32s,
    )?;

    let benches = [
        PipelineBench {
            title: format!(
                "text direction of a real text-line PNG ({} bytes)",
                png.len()
            ),
            steps: vec![
                (
                    "ppocr_preprocess (wasm)".into(),
                    model("ppocr_preprocess", vec![bytes_input("IMAGE", &png)]),
                ),
                (
                    "ppocr_cls (ONNX)".into(),
                    model(
                        "ppocr_cls",
                        vec![("x", "FP32", vec![1, 3, 48, 192], pixels)],
                    ),
                ),
                (
                    "ppocr_postprocess (wasm)".into(),
                    model(
                        "ppocr_postprocess",
                        vec![("SCORES", "FP32", vec![1, 2], probs)],
                    ),
                ),
            ],
            pipelines: vec![
                (
                    "text_direction (ensemble)".into(),
                    model("text_direction", vec![bytes_input("IMAGE", &png)]),
                ),
                (
                    "text_direction_bls (wasm + wasi-nn)".into(),
                    model("text_direction_bls", vec![bytes_input("IMAGE", &png)]),
                ),
            ],
            client_side: Some(Arc::new(png.clone())),
        },
        PipelineBench {
            title: format!("content type of a Python file ({} bytes)", file.len()),
            steps: vec![
                (
                    "magika_features (wasm)".into(),
                    model("magika_features", vec![bytes_input("CONTENT", &file)]),
                ),
                (
                    "magika (ONNX)".into(),
                    model("magika", vec![("bytes", "INT32", vec![1, 2048], features)]),
                ),
                (
                    "magika_labels (wasm)".into(),
                    model(
                        "magika_labels",
                        vec![
                            bytes_input("CONTENT", &file),
                            ("SCORES", "FP32", vec![1, 214], scores),
                        ],
                    ),
                ),
            ],
            pipelines: vec![(
                "content_type (ensemble)".into(),
                model("content_type", vec![bytes_input("CONTENT", &file)]),
            )],
            client_side: None,
        },
    ];
    let mut summary = Vec::new();
    for b in &benches {
        println!("## pipelines: {}, HTTP binary\n", b.title);
        println!("| what | concurrency | req/s | p50 µs | p99 µs |");
        println!("|---|---|---|---|---|");
        for c in [1usize, 8, 32] {
            let measure = |what: String, m: &Model| -> anyhow::Result<Stats> {
                let s = rt.block_on(over_http(addr, m, c, args.seconds, args.max_requests))?;
                pipeline_row(&what, c, &s);
                Ok(s)
            };
            let mut slowest = f64::INFINITY;
            for (what, m) in &b.steps {
                slowest = slowest.min(measure(format!("step: {what}"), m)?.rps);
            }
            for (what, m) in &b.pipelines {
                let s = measure(format!("pipeline: {what}"), m)?;
                summary.push(format!(
                    "| {what} | {c} | {:.0} | {:.0} | {:.2} |",
                    s.rps,
                    slowest,
                    s.rps / slowest
                ));
            }
            if let Some(png) = &b.client_side {
                let s = rt.block_on(client_side(
                    addr,
                    png.clone(),
                    c,
                    args.seconds,
                    args.max_requests,
                ))?;
                pipeline_row("client-side pre/post + ppocr_cls", c, &s);
            }
        }
        println!();
    }
    rt.block_on(server.shutdown())?;
    println!(
        "| pipeline | concurrency | req/s | slowest step alone req/s | pipeline/slowest step |"
    );
    println!("|---|---|---|---|---|");
    for line in summary {
        println!("{line}");
    }
    println!();
    Ok(())
}

fn trace_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    println!("## trace: add_sub over HTTP binary, tracing off vs trace_rate 1\n");
    let out = tempfile::tempdir()?;
    let file = out.path().join("trace.json");
    let server = start_server_with(
        rt,
        &workspace_root().join("tests/fixtures/repo"),
        engine,
        |s| {
            s.trace_config = vec![
                format!("triton,file={}", file.display()),
                "level=OFF".into(),
                "rate=1".into(),
                "log-frequency=1000".into(),
            ];
        },
    )?;
    let addr = server.http_addr();
    let m = models()
        .into_iter()
        .find(|m| m.name == "add_sub")
        .expect("add_sub");
    println!("| concurrency | round | off req/s | off p50 µs | traced req/s | traced p50 µs | traced/off |");
    println!("|---|---|---|---|---|---|---|");
    let set_level = |level: &'static str| async move {
        let mut c = Client::connect(addr).await?;
        let r = c
            .post_json(
                "/v2/trace/setting",
                &serde_json::json!({"trace_level": [level]}),
            )
            .await?;
        anyhow::ensure!(r.status == 200, "{}", String::from_utf8_lossy(&r.body));
        Ok::<_, anyhow::Error>(())
    };
    let mut ratios = Vec::new();
    for conc in [1usize, 8] {
        for round in 1..=3 {
            rt.block_on(set_level("OFF"))?;
            let off = rt.block_on(over_http(addr, &m, conc, args.seconds, args.max_requests))?;
            rt.block_on(set_level("TIMESTAMPS"))?;
            let on = rt.block_on(over_http(addr, &m, conc, args.seconds, args.max_requests))?;
            ratios.push(on.rps / off.rps);
            println!(
                "| {conc} | {round} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} |",
                off.rps,
                us(off.p50),
                on.rps,
                us(on.p50),
                on.rps / off.rps
            );
        }
    }
    rt.block_on(set_level("OFF"))?;
    rt.block_on(server.shutdown())?;
    let written = std::fs::read_dir(out.path())?.count();
    ratios.sort_by(f64::total_cmp);
    println!(
        "\nmedian traced/off throughput {:.3}; {written} trace files written\n",
        ratios[ratios.len() / 2]
    );
    Ok(())
}

/// The add/sub plugin built in each language (by `./dev plugins`).
fn language_plugins() -> Vec<(&'static str, &'static str, PathBuf)> {
    let t = workspace_root().join("plugins/target");
    vec![
        (
            "rust",
            "add_sub_rust",
            t.join("wasm32-wasip2/release/plugin_add_sub.wasm"),
        ),
        ("python", "add_sub_python", t.join("python/add-sub.wasm")),
        ("js", "add_sub_js", t.join("js/add-sub.wasm")),
    ]
}

const ADD_SUB_WASM_CONFIG: &str = r#"backend: "wasm"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"#;

fn languages_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    backend: &dyn Backend,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    use wisp_plugin_runtime::{WasmBackend, WasmOptions};
    let repo = tempfile::tempdir()?;
    wisp_tests::copy_dir(
        &workspace_root().join("tests/fixtures/repo/add_sub"),
        &repo.path().join("add_sub"),
    )?;
    for (lang, model, file) in language_plugins() {
        anyhow::ensure!(
            file.is_file(),
            "{} is missing ({lang}): run ./dev plugins",
            file.display()
        );
        std::fs::create_dir_all(repo.path().join(model).join("1"))?;
        std::fs::copy(&file, repo.path().join(model).join("1/model.wasm"))?;
        std::fs::write(
            repo.path().join(model).join("config.pbtxt"),
            ADD_SUB_WASM_CONFIG,
        )?;
    }
    let add_sub = models()
        .into_iter()
        .find(|m| m.name == "add_sub")
        .expect("add_sub");
    let secs = args.seconds;

    println!(
        "## languages (a): one add/sub call on one instance, in-process
"
    );
    println!("| step | p50 µs | p99 µs | calls/s | p50 vs Rust plugin |");
    println!("|---|---|---|---|---|");
    let wasm = WasmBackend::new(WasmOptions::default(), None);
    let mut rows = vec![(
        "ONNX add_sub",
        in_process(
            backend,
            "add_sub",
            repo.path(),
            &add_sub.input,
            1,
            secs,
            args.max_requests,
        )?,
    )];
    for (lang, model, _) in language_plugins() {
        let s = in_process(
            &wasm,
            model,
            repo.path(),
            &add_sub.input,
            1,
            secs,
            args.max_requests,
        )?;
        rows.push((lang, s));
    }
    let rust = us(rows[1].1.p50);
    for (what, s) in &rows {
        println!(
            "| {what} | {:.1} | {:.1} | {:.0} | {:.1}× |",
            us(s.p50),
            us(s.p99),
            s.rps,
            us(s.p50) / rust
        );
    }

    println!(
        "
## languages (b): over HTTP binary, the same server
"
    );
    println!("| model | concurrency | req/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    let server = start_server_with(rt, repo.path(), engine, |s| {
        s.no_wasm_cache = true;
    })?;
    let addr = server.http_addr();
    for conc in [1usize, 8] {
        for name in ["add_sub", "add_sub_rust", "add_sub_python", "add_sub_js"] {
            let m = Model {
                name,
                repo: repo.path().to_path_buf(),
                input: add_sub.input.clone(),
            };
            let s = rt.block_on(over_http(addr, &m, conc, secs, args.max_requests))?;
            println!(
                "| {name} | {conc} | {:.0} | {:.0} | {:.0} |",
                s.rps,
                us(s.p50),
                us(s.p99)
            );
        }
    }
    rt.block_on(server.shutdown())?;

    println!(
        "
## languages (c): component size, compile (median of 3) and load from cache
"
    );
    println!(
        "| plugin | .wasm bytes | cold compile ms | load from cache ms | instantiate + init ms |"
    );
    println!("|---|---|---|---|---|");
    for (lang, model, file) in language_plugins() {
        let dir = ModelDir {
            name: model.into(),
            path: repo.path().join(model),
        };
        let spec = prepare_config(&dir, &wasm, true).map_err(|e| anyhow!("{e}"))?;
        let cfg = &*spec.config;
        let (mut cold, mut cached, mut inst) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            let cache = tempfile::tempdir()?;
            let options = || WasmOptions {
                cache_dir: Some(cache.path().to_path_buf()),
                ..Default::default()
            };
            let (_, t) = WasmBackend::new(options(), None)
                .load_timed(&spec, &model_file(&dir.path, 1, cfg))
                .map_err(|e| anyhow!("{e}"))?;
            cold.push(t.compile);
            let (m, t) = WasmBackend::new(options(), None)
                .load_timed(&spec, &model_file(&dir.path, 1, cfg))
                .map_err(|e| anyhow!("{e}"))?;
            anyhow::ensure!(t.source == wisp_plugin_runtime::CompileSource::Cache);
            cached.push(t.compile);
            let t = Instant::now();
            drop(wisp_core::backend::LoadedModel::new_instance(&m, 0).map_err(|e| anyhow!("{e}"))?);
            inst.push(t.elapsed());
        }
        println!(
            "| {lang} | {} | {:.0} | {:.1} | {:.2} |",
            std::fs::metadata(&file)?.len(),
            median(cold).as_secs_f64() * 1e3,
            median(cached).as_secs_f64() * 1e3,
            median(inst).as_secs_f64() * 1e3,
        );
    }

    println!(
        "
## languages (d): a BLS plugin calling add_sub, batched calls vs one per request
"
    );
    let bls = tempfile::tempdir()?;
    wisp_tests::copy_dir(
        &workspace_root().join("tests/fixtures/repo/add_sub"),
        &bls.path().join("add_sub"),
    )?;
    let mut cfg = std::fs::read_to_string(bls.path().join("add_sub/config.pbtxt"))?;
    if !cfg.contains("dynamic_batching") {
        cfg.push_str(
            "
dynamic_batching { }
",
        );
    }
    std::fs::write(bls.path().join("add_sub/config.pbtxt"), cfg)?;
    for (model, mode) in [("bls_batched", "forward"), ("bls_each", "forward_each")] {
        wisp_tests::add_plugin_model(
            bls.path(),
            model,
            1,
            "testkit",
            &format!(
                "{ADD_SUB_WASM_CONFIG}dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{}{}",
                wisp_tests::config_param("mode", mode),
                wisp_tests::config_param("forward_to", "add_sub")
            ),
        );
    }
    let server = start_server_with(rt, bls.path(), engine, |s| s.no_wasm_cache = true)?;
    let addr = server.http_addr();
    println!("| concurrency | batched req/s | batched p50 µs | per-request req/s | per-request p50 µs | batched / per-request | add_sub executions per request (batched, per-request) |");
    println!("|---|---|---|---|---|---|---|");
    let executions = |addr| async move {
        let mut c = Client::connect(addr).await?;
        let r = c.get("/v2/models/add_sub/versions/1/stats").await?;
        let s = &r.json()["model_stats"][0];
        Ok::<_, anyhow::Error>((
            s["execution_count"].as_u64().unwrap_or(0),
            s["inference_count"].as_u64().unwrap_or(0),
        ))
    };
    for conc in [8usize, 32] {
        let mut cells = Vec::new();
        for name in ["bls_batched", "bls_each"] {
            let m = Model {
                name,
                repo: bls.path().to_path_buf(),
                input: add_sub.input.clone(),
            };
            let before = rt.block_on(executions(addr))?;
            let s = rt.block_on(over_http(addr, &m, conc, secs, args.max_requests))?;
            let after = rt.block_on(executions(addr))?;
            let per = (after.0 - before.0) as f64 / ((after.1 - before.1).max(1)) as f64;
            cells.push((s, per));
        }
        println!(
            "| {conc} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2}, {:.2} |",
            cells[0].0.rps,
            us(cells[0].0.p50),
            cells[1].0.rps,
            us(cells[1].0.p50),
            cells[0].0.rps / cells[1].0.rps,
            cells[0].1,
            cells[1].1
        );
    }
    rt.block_on(server.shutdown())?;
    println!();
    Ok(())
}

/// Bytes of the shm suite's input (and output).
const SHM_BYTES: usize = 4 << 20;

/// `conc` clients sending the 4 MB identity request for `secs`: as binary HTTP, or (with
/// `shm`) naming the shared memory regions `in` and `out{task}`, each client reading its
/// output back from `/dev/shm/{out_keys[task]}`.
async fn big_requests(
    addr: std::net::SocketAddr,
    shm: Option<&[String]>,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let rows = (SHM_BYTES / 64) as i64;
    let input: Vec<u8> = (0..SHM_BYTES / 4)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let (binary_body, header_len) = binary_request(&[("x", "FP32", vec![rows, 16], input)], true);
    let binary_body = bytes::Bytes::from(binary_body);
    let mut tasks = Vec::new();
    for task in 0..conc {
        let body = match shm {
            Some(_) => bytes::Bytes::from(serde_json::to_vec(&serde_json::json!({
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 16],
                            "parameters": {"shared_memory_region": "in",
                                           "shared_memory_byte_size": SHM_BYTES}}],
                "outputs": [{"name": "y",
                             "parameters": {"shared_memory_region": format!("out{task}"),
                                            "shared_memory_byte_size": SHM_BYTES}}]
            }))?),
            None => binary_body.clone(),
        };
        let headers: Vec<(&'static str, String)> = match shm {
            Some(_) => vec![("content-type", "application/json".into())],
            None => vec![("inference-header-content-length", header_len.to_string())],
        };
        let out_file = shm.map(|keys| format!("/dev/shm/{}", keys[task].trim_start_matches('/')));
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let path = "/v2/models/identity_big/infer";
            let mut lat = Vec::new();
            let warm = Instant::now();
            let mut start = Instant::now();
            let (mut measuring, mut warmed) = (false, 0);
            // (warm-up runs until it ends, however long one request takes)
            while (!measuring || start.elapsed().as_secs_f64() < secs) && lat.len() < cap {
                if !measuring && warm.elapsed().as_secs_f64() >= secs / 4.0 {
                    measuring = true;
                    start = Instant::now();
                }
                let t = Instant::now();
                let r = c.send("POST", path, &headers, body.clone()).await?;
                anyhow::ensure!(
                    r.status == 200,
                    "HTTP {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
                );
                let got = match &out_file {
                    Some(f) => std::fs::read(f)?.len(),
                    None => r.body.len(),
                };
                anyhow::ensure!(got >= SHM_BYTES, "short output: {got} bytes");
                if measuring {
                    lat.push(t.elapsed());
                } else {
                    warmed += 1;
                }
            }
            Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
        }));
    }
    gather(tasks).await
}

fn shm_suite(args: &Args, rt: &tokio::runtime::Runtime, engine: OnnxEngine) -> anyhow::Result<()> {
    println!("## shm: a 4 MB input and output, binary HTTP vs system shared memory\n");
    let dir = tempfile::tempdir()?;
    let m = dir.path().join("identity_big");
    std::fs::create_dir_all(m.join("1"))?;
    std::fs::copy(
        workspace_root().join("tests/fixtures/vision/identity/1/model.onnx"),
        m.join("1/model.onnx"),
    )?;
    std::fs::write(
        m.join("config.pbtxt"),
        r#"platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"#,
    )?;
    let server = start_server(rt, dir.path(), engine)?;
    let addr = server.http_addr();
    let max_conc = 8;
    let pid = std::process::id();
    let in_key = format!("/wisp_bench_in_{pid}");
    let out_keys: Vec<String> = (0..max_conc)
        .map(|k| format!("/wisp_bench_out{k}_{pid}"))
        .collect();
    let input: Vec<u8> = (0..SHM_BYTES / 4)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    std::fs::write(format!("/dev/shm{in_key}"), &input)?;
    for k in &out_keys {
        std::fs::write(format!("/dev/shm{k}"), vec![0u8; SHM_BYTES])?;
    }
    let result = rt.block_on(async {
        let mut c = Client::connect(addr).await?;
        let register = |name: String, key: &str| {
            let body = serde_json::json!({"key": key, "byte_size": SHM_BYTES});
            (name, body)
        };
        let mut all = vec![register("in".into(), &in_key)];
        for (k, key) in out_keys.iter().enumerate() {
            all.push(register(format!("out{k}"), key));
        }
        for (name, body) in all {
            let r = c
                .post_json(
                    &format!("/v2/systemsharedmemory/region/{name}/register"),
                    &body,
                )
                .await?;
            anyhow::ensure!(
                r.status == 200,
                "register {name}: {}",
                String::from_utf8_lossy(&r.body)
            );
        }
        println!("| concurrency | transport | req/s | MB/s in | p50 ms | p99 ms | shm/binary |");
        println!("|---|---|---|---|---|---|---|");
        for conc in [1usize, max_conc] {
            let mut binary_rps = 0.0;
            for use_shm in [false, true] {
                let s = big_requests(
                    addr,
                    use_shm.then_some(out_keys.as_slice()),
                    conc,
                    args.seconds,
                    args.max_requests,
                )
                .await?;
                let ratio = if use_shm {
                    format!("{:.2}", s.rps / binary_rps)
                } else {
                    binary_rps = s.rps;
                    String::new()
                };
                println!(
                    "| {conc} | {} | {:.1} | {:.0} | {:.2} | {:.2} | {ratio} |",
                    if use_shm {
                        "system shared memory"
                    } else {
                        "binary HTTP"
                    },
                    s.rps,
                    s.rps * SHM_BYTES as f64 / 1e6,
                    us(s.p50) / 1000.0,
                    us(s.p99) / 1000.0
                );
            }
        }
        Ok::<_, anyhow::Error>(())
    });
    let _ = std::fs::remove_file(format!("/dev/shm{in_key}"));
    for k in &out_keys {
        let _ = std::fs::remove_file(format!("/dev/shm{k}"));
    }
    rt.block_on(server.shutdown())?;
    println!();
    result
}

/// Requests per sequence in the sequence suite.
const SEQUENCE_LENGTH: u64 = 10;

/// `conc` clients, each running whole sequences back to back for `secs`: with `stateful`,
/// through the sequence batcher (the client sends only `INPUT` and the flags); without, to the
/// stateless twin with the client carrying `STATE_IN` and the controls itself. Returns
/// (sequences per second, per-request stats).
async fn run_sequences(
    addr: std::net::SocketAddr,
    stateful: bool,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<(f64, Stats)> {
    let mut tasks = Vec::new();
    for task in 0..conc as u64 {
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let (mut lat, mut sequences) = (Vec::new(), 0u64);
            let start = Instant::now();
            let mut id = task * 1_000_000 + 1;
            while start.elapsed().as_secs_f64() < secs && lat.len() < cap {
                let mut state = 0.0f32;
                for step in 0..SEQUENCE_LENGTH {
                    let value = step as f32;
                    let (first, last) = (step == 0, step == SEQUENCE_LENGTH - 1);
                    let one = |name: &str, dt: &str, v: serde_json::Value| {
                        serde_json::json!({"name": name, "datatype": dt, "shape": [1, 1], "data": [v]})
                    };
                    let (path, body) = if stateful {
                        (
                            "/v2/models/accumulate/infer",
                            serde_json::json!({
                                "inputs": [one("INPUT", "FP32", value.into())],
                                "outputs": [{"name": "OUTPUT"}],
                                "parameters": {"sequence_id": id, "sequence_start": first,
                                               "sequence_end": last}}),
                        )
                    } else {
                        (
                            "/v2/models/accumulate_stateless/infer",
                            serde_json::json!({"inputs": [
                                one("INPUT", "FP32", value.into()),
                                one("STATE_IN", "FP32", state.into()),
                                one("START", "INT32", i32::from(first).into()),
                                one("END", "INT32", i32::from(last).into()),
                                one("CORRID", "UINT64", id.into())],
                                "outputs": [{"name": "OUTPUT"}]}),
                        )
                    };
                    let t = Instant::now();
                    let r = c.post_json(path, &body).await?;
                    lat.push(t.elapsed());
                    anyhow::ensure!(
                        r.status == 200,
                        "HTTP {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    );
                    let got = r.json()["outputs"][0]["data"][0].as_f64().unwrap_or(-1.0) as f32;
                    state += value;
                    anyhow::ensure!(got == state, "sequence {id}: got {got}, want {state}");
                }
                sequences += 1;
                id += 1;
            }
            Ok::<_, anyhow::Error>((lat, sequences, start.elapsed()))
        }));
    }
    let (mut all, mut sequences, mut wall) = (Vec::new(), 0, Duration::ZERO);
    for t in tasks {
        let (lat, n, w) = t.await??;
        all.extend(lat);
        sequences += n;
        wall = wall.max(w);
    }
    Ok((sequences as f64 / wall.as_secs_f64(), stats(all, wall)))
}

fn sequence_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    println!(
        "## sequence: `oldest` sequence batching vs the client carrying the state ({SEQUENCE_LENGTH} requests a sequence, HTTP JSON, 2 instances)\n"
    );
    let dir = tempfile::tempdir()?;
    let fixture = workspace_root().join("tests/fixtures/sequence/accumulate_oldest");
    let model = std::fs::read(fixture.join("1/model.onnx"))?;
    let config = std::fs::read_to_string(fixture.join("config.pbtxt"))?
        .replace("accumulate_oldest", "accumulate")
        .replace("max_candidate_sequences: 4", "max_candidate_sequences: 16");
    let stateless = r#"platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "STATE_IN" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "START" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "END" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { kind: KIND_CPU count: 2 } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
"#;
    for (name, cfg) in [
        ("accumulate", config.as_str()),
        ("accumulate_stateless", stateless),
    ] {
        std::fs::create_dir_all(dir.path().join(name).join("1"))?;
        std::fs::write(dir.path().join(name).join("1/model.onnx"), &model)?;
        std::fs::write(dir.path().join(name).join("config.pbtxt"), cfg)?;
    }
    let server = start_server(rt, dir.path(), engine)?;
    println!("| concurrent sequences | mode | sequences/s | req/s | p50 µs | p99 µs | sequencer/stateless |");
    println!("|---|---|---|---|---|---|---|");
    for conc in [8usize, 32] {
        let mut stateless_rate = 0.0;
        for stateful in [false, true] {
            let (per_sec, s) = rt.block_on(run_sequences(
                server.http_addr(),
                stateful,
                conc,
                args.seconds,
                args.max_requests.div_ceil(conc),
            ))?;
            let ratio = if stateful {
                format!("{:.2}", per_sec / stateless_rate)
            } else {
                stateless_rate = per_sec;
                String::new()
            };
            println!(
                "| {conc} | {} | {per_sec:.0} | {:.0} | {:.0} | {:.0} | {ratio} |",
                if stateful {
                    "sequence batcher (oldest)"
                } else {
                    "stateless, client-carried state"
                },
                s.rps,
                us(s.p50),
                us(s.p99)
            );
        }
    }
    rt.block_on(server.shutdown())?;
    println!();
    Ok(())
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
