//! The shm and sequence suites: large tensors through system shared memory against binary HTTP, and stateful sequences.

use super::*;

/// Bytes of the shm suite's input (and output).
pub(super) const SHM_BYTES: usize = 4 << 20;

/// `conc` clients sending the 4 MB identity request for `secs`: as binary HTTP, or (with
/// `shm`) naming the shared memory regions `in` and `out{task}`, each client reading its
/// output back from `/dev/shm/{out_keys[task]}`.
pub(super) async fn big_requests(
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

pub(super) fn shm_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
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
    let server = start_server_with(rt, dir.path(), engine, |s| s.allow_client_shm = true)?;
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
pub(super) const SEQUENCE_LENGTH: u64 = 10;

/// `conc` clients, each running whole sequences back to back for `secs`: with `stateful`,
/// through the sequence batcher (the client sends only `INPUT` and the flags); without, to the
/// stateless twin with the client carrying `STATE_IN` and the controls itself. Returns
/// (sequences per second, per-request stats).
pub(super) async fn run_sequences(
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

pub(super) fn sequence_suite(
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
