//! The `soak` suite of `wisp-bench`: the real `wisp` program (release, in its own process, so
//! its memory is its own) on the demo repository under bounded mixed load for
//! `--soak-minutes` minutes:
//!
//! - good traffic: `add_sub` over HTTP JSON, the PP-OCR classifier over HTTP binary, the
//!   `text_direction` ensemble (wasm → ONNX → wasm) on a real image, `add_sub` over gRPC,
//!   `add_sub` with a gzip body, and `add_sub` reading and writing system shared memory (each
//!   answer checked, and the regions unregistered and registered again every 200 requests);
//! - bad traffic: lying shapes, malformed JSON, a gzip bomb, and a shared-memory region whose
//!   object is truncated to zero after it was registered, in a loop;
//! - slow clients: connections that trickle a request head and stall, replaced as they are cut;
//! - a reload of `add_sub` and of `ppocr_cls` every 30 s (explicit control mode);
//! - issue 58's attackers ([`super::soak_attackers`]): gRPC and SSE stream clients that never
//!   read, PING-only HTTP/2 connections, and a second shared-memory token.
//!
//! It reports, per minute, good requests and failures and their p50/p99, bad requests answered
//! and the server's RSS, and the RSS at the start. Every loop is bounded by the duration.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use wisp_tests::{binary_request, bytes_element, f32_bytes, workspace_root, Client, GrpcClient};

fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Latencies of good requests per minute, and failures.
#[derive(Default)]
struct Minute {
    good: Vec<Duration>,
    failed: u64,
    bad_answered: u64,
    /// The server's RSS when last sampled in this minute, in bytes.
    rss: u64,
}

type Minutes = Arc<Mutex<Vec<Minute>>>;

fn record(minutes: &Minutes, start: Instant, f: impl FnOnce(&mut Minute)) {
    let i = (start.elapsed().as_secs() / 60) as usize;
    let mut m = minutes.lock().expect("minutes lock");
    while m.len() <= i {
        m.push(Minute::default());
    }
    f(&mut m[i]);
}

/// Runs the soak for `minutes` minutes and prints its report.
pub fn soak(rt: &tokio::runtime::Runtime, minutes: f64) -> anyhow::Result<()> {
    let root = workspace_root();
    let repo = root.join("model_repo");
    anyhow::ensure!(
        repo.join("ppocr_preprocess/1/model.wasm").is_file(),
        "model_repo plugins missing: run ./dev bench (it builds and installs them)"
    );
    let wisp = std::env::current_exe()?
        .parent()
        .context("exe dir")?
        .join("wisp");
    let (port, grpc_port) = (free_port(), free_port());
    let child = Child(
        std::process::Command::new(&wisp)
            .args(["serve", "--model-repository"])
            .arg(&repo)
            .args(["--model-control-mode", "explicit", "--load-model", "*"])
            .arg("--allow-unauthenticated-control")
            .arg("--allow-client-shm=true")
            // Short enough for PING-only connections to be cut several times in a soak.
            .args(["--idle-timeout-secs", "10"])
            .args([
                "--http-address",
                "127.0.0.1",
                "--http-port",
                &port.to_string(),
            ])
            .args([
                "--grpc-port",
                &grpc_port.to_string(),
                "--metrics-port",
                &free_port().to_string(),
            ])
            .args([
                "--http-header-timeout-secs",
                "5",
                "--log-info",
                "false",
                "--log-warning",
                "false",
            ])
            .spawn()
            .with_context(|| format!("cannot start {}", wisp.display()))?,
    );
    let pid = child.0.id();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let gaddr: std::net::SocketAddr = format!("127.0.0.1:{grpc_port}").parse()?;
    let png = std::fs::read(root.join("tests/fixtures/images/text_upright.png"))?;
    let pixels = f32_bytes(&vec![0.5f32; 3 * 48 * 192]);
    let total = Duration::from_secs_f64(minutes * 60.0);
    rt.block_on(async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) = Client::connect(addr).await {
                if c.get("/v2/health/ready").await.is_ok_and(|r| r.status == 200) {
                    break;
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "wisp did not become ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // warm up, then take the starting RSS
        let mut c = Client::connect(addr).await?;
        for _ in 0..200 {
            c.post_json("/v2/models/add_sub/infer", &add_sub()).await?;
        }
        let rss_start = rss(pid);
        let start = Instant::now();
        let minutes: Minutes = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let reloads = Arc::new(AtomicU64::new(0));
        let slow_cut = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let shm = ShmPair::create()?;
        // A region the token-less scope keeps for the whole soak, so that its key stays that
        // scope's while the good client re-registers its own (the second token's attempts on
        // the key must then always be refused).
        let pin = json!({"key": shm.0.input, "byte_size": SHM_BYTES});
        let pinned = c.post_json("/v2/systemsharedmemory/region/soak_pin/register", &pin).await?;
        anyhow::ensure!(pinned.status == 200, "cannot register the pinned shm region");
        // good traffic
        for kind in 0..6u8 {
            let (minutes, stop, png, pixels, shm) =
                (minutes.clone(), stop.clone(), png.clone(), pixels.clone(), shm.clone());
            tasks.push(tokio::spawn(async move {
                let mut http = Client::connect(addr).await.ok();
                let mut grpc = GrpcClient::connect(gaddr).await.ok();
                let gz_body = gzip(&serde_json::to_vec(&add_sub()).unwrap_or_default());
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let t = Instant::now();
                    let ok = match kind {
                        0 => good_http(&mut http, addr, "/v2/models/add_sub/infer", None, add_sub()).await,
                        1 => {
                            let (body, n) = binary_request(&[("x", "FP32", vec![1, 3, 48, 192], pixels.clone())], true);
                            good_http(&mut http, addr, "/v2/models/ppocr_cls/infer", Some((body, n)), json!(null)).await
                        }
                        2 => {
                            let (body, n) = binary_request(&[("IMAGE", "BYTES", vec![1, 1], bytes_element(&png))], false);
                            good_http(&mut http, addr, "/v2/models/text_direction/infer", Some((body, n)), json!(null)).await
                        }
                        3 => good_grpc(&mut grpc, gaddr).await,
                        4 => good_gzip(&mut http, addr, gz_body.clone()).await,
                        _ => good_shm(&mut http, addr, &shm, n).await,
                    };
                    let dt = t.elapsed();
                    record(&minutes, start, |m| if ok { m.good.push(dt) } else { m.failed += 1 });
                }
            }));
        }
        // bad traffic
        {
            let (minutes, stop) = (minutes.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                std::io::Write::write_all(&mut gz, &vec![b'['; 8 << 20]).ok();
                let bomb = gz.finish().unwrap_or_default();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let Ok(mut c) = Client::connect(addr).await else { continue };
                    let r = match i % 4 {
                        0 => c.post_json("/v2/models/add_sub/infer", &json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1u64 << 40], "data": [1]}]})).await,
                        1 => c.send("POST", "/v2/models/ppocr_cls/infer", &[], "{\"inputs\": [").await,
                        2 => c.send("POST", "/v2/models/add_sub/infer", &[("content-encoding", "gzip".into())], bomb.clone()).await,
                        _ => truncated_shm(&mut c, i).await,
                    };
                    let answered = r.map(|r| (400..500).contains(&r.status)).unwrap_or(false);
                    record(&minutes, start, |m| if answered { m.bad_answered += 1 });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
        // slow clients: 20 at a time, each trickling a request head
        for _ in 0..20 {
            let (stop, slow_cut) = (stop.clone(), slow_cut.clone());
            tasks.push(tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { continue };
                    let _ = s.write_all(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n").await;
                    let mut buf = [0u8; 64];
                    let cut = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
                    if matches!(cut, Ok(Ok(0)) | Ok(Err(_))) {
                        slow_cut.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        // issue 58's attackers
        let tally = Arc::new(super::soak_attackers::Tally::default());
        tasks.extend(super::soak_attackers::spawn(
            addr,
            gaddr,
            shm.0.input.clone(),
            stop.clone(),
            tally.clone(),
        ));
        // reloads
        {
            let (stop, reloads) = (stop.clone(), reloads.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    for m in ["add_sub", "ppocr_cls"] {
                        if let Ok(mut c) = Client::connect(addr).await {
                            let path = format!("/v2/repository/models/{m}/load");
                            if c.send("POST", &path, &[], "").await.is_ok_and(|r| r.status == 200) {
                                reloads.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }));
        }
        // RSS, sampled every 5 s: each minute's row shows its last sample. Plugins, sessions
        // and pools reach their working size in the first minute of real traffic, so growth is
        // judged from the end of the first minute.
        {
            let (minutes, stop) = (minutes.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let now = rss(pid);
                    record(&minutes, start, |m| m.rss = now);
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            });
        }
        tokio::time::sleep(total).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(35), t).await;
        }
        let rss_end = rss(pid);
        println!("## soak: {minutes_total:.0} min of mixed load on `{}` (model_repo)\n", wisp.display(), minutes_total = total.as_secs_f64() / 60.0);
        println!("| minute | good requests | failed good | p50 µs | p99 µs | bad requests answered 4xx | RSS MB |");
        println!("|---|---|---|---|---|---|---|");
        let mut failed_total = 0;
        let rows = total.as_secs().div_ceil(60) as usize;
        for (i, m) in minutes
            .lock()
            .expect("minutes lock")
            .iter_mut()
            .take(rows)
            .enumerate()
        {
            m.good.sort_unstable();
            let q = |p: f64| m.good.get(((m.good.len() as f64 * p) as usize).min(m.good.len().saturating_sub(1))).map_or(0.0, |d| d.as_secs_f64() * 1e6);
            failed_total += m.failed;
            println!("| {} | {} | {} | {:.0} | {:.0} | {} | {:.1} |", i + 1, m.good.len(), m.failed, q(0.5), q(0.99), m.bad_answered, m.rss as f64 / 1048576.0);
        }
        println!();
        let rss_warm = minutes.lock().expect("minutes lock").first().map_or(1, |m| m.rss.max(1));
        println!(
            "RSS at start {:.1} MB, after the first minute {:.1} MB, at the end {:.1} MB ({:+.1}% since the first minute); reloads {}; slow connections cut {}; failed good requests {}\n",
            rss_start as f64 / 1048576.0,
            rss_warm as f64 / 1048576.0,
            rss_end as f64 / 1048576.0,
            (rss_end as f64 / rss_warm as f64 - 1.0) * 100.0,
            reloads.load(Ordering::Relaxed),
            slow_cut.load(Ordering::Relaxed),
            failed_total
        );
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        println!(
            "Attackers: non-reading gRPC streams cut {}, non-reading SSE clients cut {}, PING-only connections cut {}; second shm token: {} good, {} failed, its registrations of the first token's key refused as missing {}, accepted {}\n",
            n(&tally.grpc_cut),
            n(&tally.sse_cut),
            n(&tally.ping_cut),
            n(&tally.shm_b_good),
            n(&tally.shm_b_failed),
            n(&tally.shm_b_refused),
            n(&tally.shm_b_breached),
        );
        drop(child);
        Ok(())
    })
}

/// Bytes of each soak shared-memory object: `add_sub`'s two inputs, or its two outputs.
const SHM_BYTES: usize = 2 * 16 * 4;

/// The good shm client's two objects in `/dev/shm`, removed when the soak ends.
#[derive(Clone)]
struct ShmPair(Arc<ShmFiles>);

struct ShmFiles {
    input: String,
    output: String,
}

impl ShmPair {
    fn create() -> anyhow::Result<Self> {
        let pid = std::process::id();
        let files = ShmFiles {
            input: format!("/wisp_soak_in_{pid}"),
            output: format!("/wisp_soak_out_{pid}"),
        };
        let mut input = f32_bytes(&[1.0; 16]);
        input.extend(f32_bytes(&[2.0; 16]));
        std::fs::write(format!("/dev/shm{}", files.input), input)?;
        std::fs::write(format!("/dev/shm{}", files.output), [0u8; SHM_BYTES])?;
        Ok(Self(Arc::new(files)))
    }
}

impl Drop for ShmFiles {
    fn drop(&mut self) {
        for key in [&self.input, &self.output] {
            let _ = std::fs::remove_file(format!("/dev/shm{key}"));
        }
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = std::io::Write::write_all(&mut gz, bytes);
    gz.finish().unwrap_or_default()
}

/// `add_sub` with a gzip-compressed JSON body: 200 and the right sum.
async fn good_gzip(c: &mut Option<Client>, addr: std::net::SocketAddr, body: Vec<u8>) -> bool {
    if c.is_none() {
        *c = Client::connect(addr).await.ok();
    }
    let Some(client) = c.as_mut() else {
        return false;
    };
    let headers = [
        ("content-encoding", "gzip".to_string()),
        ("content-type", "application/json".to_string()),
    ];
    match client
        .send("POST", "/v2/models/add_sub/infer", &headers, body)
        .await
    {
        Ok(r) if r.status == 200 => r.json()["outputs"][0]["data"][0] == json!(3.0),
        _ => {
            *c = None;
            false
        }
    }
}

/// `add_sub` reading both inputs from one registered region and writing `OUTPUT0` into
/// another, the answer read back from the object; every 200th request first unregisters and
/// registers both regions again.
async fn good_shm(
    c: &mut Option<Client>,
    addr: std::net::SocketAddr,
    shm: &ShmPair,
    n: u64,
) -> bool {
    if c.is_none() {
        *c = Client::connect(addr).await.ok();
    }
    let Some(client) = c.as_mut() else {
        return false;
    };
    let ok = async {
        if n % 200 == 1 {
            for (name, key) in [("soak_in", &shm.0.input), ("soak_out", &shm.0.output)] {
                let base = format!("/v2/systemsharedmemory/region/{name}");
                client
                    .send("POST", &format!("{base}/unregister"), &[], "")
                    .await
                    .ok()?;
                let body = json!({"key": key, "byte_size": SHM_BYTES});
                let r = client
                    .post_json(&format!("{base}/register"), &body)
                    .await
                    .ok()?;
                if r.status != 200 {
                    return None;
                }
            }
        }
        let region = |name: &str, offset: usize| json!({"shared_memory_region": name, "shared_memory_byte_size": 64, "shared_memory_offset": offset});
        let body = json!({
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": region("soak_in", 0)},
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "parameters": region("soak_in", 64)},
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": region("soak_out", 0)}],
        });
        let r = client
            .post_json("/v2/models/add_sub/infer", &body)
            .await
            .ok()?;
        if r.status != 200 {
            return None;
        }
        // Requests on this connection are sequential, so the region holds this answer.
        let out = std::fs::read(format!("/dev/shm{}", shm.0.output)).ok()?;
        (out[..64] == f32_bytes(&[3.0; 16])[..]).then_some(())
    };
    match ok.await {
        Some(()) => true,
        None => {
            *c = None;
            false
        }
    }
}

/// The SIGBUS attack: register a fresh 1 MiB object, truncate it to zero, infer from it. The
/// answer must be a 4xx and the server must keep serving.
async fn truncated_shm(c: &mut Client, i: u64) -> anyhow::Result<wisp_tests::Reply> {
    let key = format!("/wisp_soak_trunc_{}_{i}", std::process::id());
    let file = format!("/dev/shm{key}");
    std::fs::write(&file, vec![1u8; 1 << 20])?;
    let name = format!("trunc{i}");
    let base = format!("/v2/systemsharedmemory/region/{name}");
    let body = json!({"key": key, "byte_size": 1 << 20});
    let registered = c.post_json(&format!("{base}/register"), &body).await;
    std::fs::File::options()
        .write(true)
        .open(&file)?
        .set_len(0)?;
    let infer = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"shared_memory_region": name, "shared_memory_byte_size": 64}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
    ]});
    let r = c.post_json("/v2/models/add_sub/infer", &infer).await;
    let _ = c.send("POST", &format!("{base}/unregister"), &[], "").await;
    let _ = std::fs::remove_file(&file);
    registered?;
    r
}

fn add_sub() -> serde_json::Value {
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![2.0f32; 16]},
    ]})
}

async fn good_http(
    c: &mut Option<Client>,
    addr: std::net::SocketAddr,
    path: &str,
    binary: Option<(Vec<u8>, usize)>,
    body: serde_json::Value,
) -> bool {
    if c.is_none() {
        *c = Client::connect(addr).await.ok();
    }
    let Some(client) = c.as_mut() else {
        return false;
    };
    let r = match binary {
        Some((b, n)) => {
            client
                .send(
                    "POST",
                    path,
                    &[("inference-header-content-length", n.to_string())],
                    b,
                )
                .await
        }
        None => client.post_json(path, &body).await,
    };
    match r {
        Ok(r) if r.status == 200 => true,
        _ => {
            *c = None;
            false
        }
    }
}

async fn good_grpc(g: &mut Option<GrpcClient>, addr: std::net::SocketAddr) -> bool {
    use wisp_server::grpc::pb;
    if g.is_none() {
        *g = GrpcClient::connect(addr).await.ok();
    }
    let Some(client) = g.as_mut() else {
        return false;
    };
    let req = wisp_tests::add_sub_grpc_request();
    match client
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
        .await
    {
        Ok(Ok(_)) => true,
        _ => {
            *g = None;
            false
        }
    }
}
