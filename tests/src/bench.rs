//! `wisp-bench` (run by `./dev bench`), two suites, each side by side in one run:
//!
//! - `http`: the server over HTTP with binary tensors vs the same backend called in-process with
//!   no server (the limit), for the tiny `add_sub` and the MobileNet-class PP-OCR direction
//!   classifier of `model_repo/`, at concurrency 1, 4, 16.
//! - `batching`: the PP-OCR classifier over HTTP binary at concurrency 1, 8, 32 with (a) no
//!   batching and one instance, (b) the dynamic batcher, against (c) the backend in-process at
//!   its best batch size.
//!
//! Every loop is bounded by time and count; traffic is loopback only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::Parser;
use wisp_backend_onnx::{find_onnxruntime, EngineChoice, OnnxBackend, ProcessEnv};
use wisp_core::backend::Backend;
use wisp_core::repository::ModelDir;
use wisp_core::{DataType, InferRequest, Tensor};
use wisp_server::registry::{model_file, prepare_config};
use wisp_server::settings::{OnnxEngine, Settings};
use wisp_server::Server;
use wisp_tests::{binary_request, workspace_root, Client};

#[derive(Parser)]
struct Args {
    /// Suites to run: http, batching (default both).
    #[arg(value_delimiter = ',', default_value = "http,batching")]
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
}

struct Stats {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
    lat.sort_unstable();
    let pick = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    Stats {
        rps: lat.len() as f64 / wall.as_secs_f64(),
        p50: pick(0.5),
        p99: pick(0.99),
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
    backend: &OnnxBackend,
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
    let cfg = prepare_config(&dir, backend, true).map_err(|e| anyhow!("{e}"))?;
    let loaded = backend
        .load(&cfg, &model_file(&dir.path, 1, &cfg))
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
    let body = bytes::Bytes::from(body);
    let path = Arc::new(format!("/v2/models/{}/infer", m.name));
    let headers = Arc::new(vec![("inference-header-content-length", n.to_string())]);
    let mut tasks = Vec::new();
    let per_task_cap = cap.div_ceil(conc);
    for _ in 0..conc {
        let (body, path, headers) = (body.clone(), path.clone(), headers.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let warm = Instant::now();
            while warm.elapsed().as_secs_f64() < secs / 4.0 {
                c.send("POST", &path, &headers, body.clone()).await?;
            }
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                let t = Instant::now();
                let r = c.send("POST", &path, &headers, body.clone()).await?;
                lat.push(t.elapsed());
                anyhow::ensure!(
                    r.status == 200,
                    "HTTP {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
            }
            Ok::<_, anyhow::Error>((lat, start.elapsed()))
        }));
    }
    let mut all = Vec::new();
    let mut wall = Duration::ZERO;
    for t in tasks {
        let (lat, w) = t.await??;
        all.extend(lat);
        wall = wall.max(w);
    }
    Ok(stats(all, wall))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn start_server(
    rt: &tokio::runtime::Runtime,
    repo: &Path,
    engine: OnnxEngine,
) -> anyhow::Result<Server> {
    let mut settings = Settings::for_repository(repo);
    settings.http_address = "127.0.0.1".parse()?;
    settings.http_port = 0;
    settings.metrics_port = 0;
    settings.grpc_port = 0;
    settings.onnx_engine = engine;
    settings.log_info = false;
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
            let s = rt.block_on(over_http(addr, &m, c, args.seconds, args.max_requests))?;
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
        rt.block_on(server.shutdown())?;
    }
    println!();
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
        "wisp-bench: engine {}, {} s per cell, {} cores\n",
        backend.engine(),
        args.seconds,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for suite in &args.suites {
        match suite.as_str() {
            "http" => http_suite(&args, &rt, &backend, engine)?,
            "batching" => batching_suite(&args, &rt, &backend, engine)?,
            other => anyhow::bail!("unknown suite '{other}' (http, batching)"),
        }
    }
    Ok(())
}
