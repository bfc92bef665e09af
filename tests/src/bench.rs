//! `wisp-bench` (run by `./dev bench`): the server over HTTP with binary tensors vs the same
//! backend called in-process with no server (the limit), side by side in one run.
//!
//! For each model (tiny `add_sub` from the fixtures, and the MobileNet-class PP-OCR direction
//! classifier of `model_repo/`) and each concurrency, it reports requests/s, p50 and p99, and the
//! ratios server/in-process. Every loop is bounded by time and count; traffic is loopback only.

use std::path::PathBuf;
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
    /// ONNX engine: onnxruntime or tract.
    #[arg(long, default_value = "onnxruntime")]
    engine: String,
    /// Seconds measured per cell (after a warm-up of a quarter of that).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
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

/// The backend alone: one instance, called in a loop on this thread (the server gives each
/// of these models one instance too).
fn in_process(backend: &OnnxBackend, m: &Model, secs: f64, cap: usize) -> anyhow::Result<Stats> {
    let dir = ModelDir {
        name: m.name.into(),
        path: m.repo.join(m.name),
    };
    let cfg = prepare_config(&dir, backend, true).map_err(|e| anyhow!("{e}"))?;
    let loaded = backend
        .load(&cfg, &model_file(&dir.path, 1, &cfg))
        .map_err(|e| anyhow!("{e}"))?;
    let mut inst = loaded.new_instance(0).map_err(|e| anyhow!("{e}"))?;
    let req = InferRequest {
        inputs: m
            .input
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
    let batch = [req];
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
        r.into_iter().next().unwrap().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(stats(lat, start.elapsed()))
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
    println!("| model | concurrency | in-process req/s | p50 µs | p99 µs | server req/s | p50 µs | p99 µs | server/in-process throughput | added p50 µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for m in models() {
        if !m.repo.join(m.name).is_dir() {
            anyhow::bail!(
                "{} missing: run ./dev bench (it fetches the demo models)",
                m.name
            );
        }
        let mut settings = Settings::for_repository(&m.repo);
        settings.http_address = "127.0.0.1".parse()?;
        settings.http_port = 0;
        settings.metrics_port = 0;
        settings.onnx_engine = engine;
        settings.log_info = false;
        let server = rt
            .block_on(Server::start(settings))
            .context("server start")?;
        let addr = server.http_addr();
        let inproc = in_process(&backend, &m, args.seconds, args.max_requests)?;
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
    Ok(())
}
