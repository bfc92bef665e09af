//! The `embeddings` suite: text embeddings with all-MiniLM-L6-v2, side by side in one run at
//! concurrency 1, 8 and 32, one text per request, each client cycling through the same
//! sentences (the non-empty, not over-long sentences of tests/fixtures/text/embeddings.json):
//!
//! - (a) Wisp's OpenAI-compatible `POST /v1/embeddings` (JSON);
//! - (b) the `text_embedding` ensemble over KServe v2 (binary tensors);
//! - (c) the ONNX encoder alone over KServe v2, fed the same texts pre-tokenized (each padded
//!   to its own length), with the same dynamic batching; plus its in-process ceiling at batch
//!   1, 8 and 32;
//! - (d) the same pipeline in one Python process: `tokenizers`, ONNX Runtime and numpy pooling
//!   behind a threaded HTTP server (benches/python_embeddings_server.py).
//!
//! Then the tokenizer step alone per text: the wasm plugin on one instance in-process vs the
//! same `tokenizers` crate compiled natively.

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bytes::Bytes;
use wisp_core::backend::Backend;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{binary_request, bytes_element, workspace_root, Client};

use super::{gather, in_process, start_server, stats, us, Args, Stats};

/// The texts: the reference sentences that are neither empty nor longer than 64 tokens.
fn texts(root: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(root.join("tests/fixtures/text/embeddings.json"))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    Ok(v["sentences"]
        .as_array()
        .ok_or_else(|| anyhow!("embeddings.json has no sentences"))?
        .iter()
        .filter_map(|s| s["text"].as_str())
        .filter(|t| !t.is_empty() && t.split_whitespace().count() < 48)
        .map(str::to_string)
        .collect())
}

/// One POST target: path, headers, and the bodies each client cycles through.
struct Target {
    path: String,
    binary: bool,
    bodies: Arc<Vec<(Bytes, usize)>>,
}

async fn cycle(
    addr: std::net::SocketAddr,
    target: &Target,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    let per_task_cap = cap.div_ceil(conc);
    let mut tasks = Vec::new();
    for task in 0..conc {
        let (path, binary, bodies) = (target.path.clone(), target.binary, target.bodies.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await?;
            let mut next = task;
            let (warm, mut warmed) = (Instant::now(), 0);
            while warm.elapsed().as_secs_f64() < secs / 4.0 {
                next += 1;
                send_one(&mut c, &path, binary, &bodies[next % bodies.len()]).await?;
                warmed += 1;
            }
            let mut lat = Vec::new();
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                next += 1;
                let t = Instant::now();
                send_one(&mut c, &path, binary, &bodies[next % bodies.len()]).await?;
                lat.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
        }));
    }
    gather(tasks).await
}

async fn send_one(
    c: &mut Client,
    path: &str,
    binary: bool,
    (body, n): &(Bytes, usize),
) -> anyhow::Result<()> {
    let headers: Vec<(&str, String)> = if binary {
        vec![("inference-header-content-length", n.to_string())]
    } else {
        vec![("content-type", "application/json".to_string())]
    };
    let r = c.send("POST", path, &headers, body.clone()).await?;
    anyhow::ensure!(
        r.status == 200,
        "{path}: HTTP {}: {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    Ok(())
}

fn json_body(model: &str, text: &str) -> (Bytes, usize) {
    let body = serde_json::json!({ "model": model, "input": text }).to_string();
    (Bytes::from(body), 0)
}

/// Each text tokenized by the server's own `text_tokenize` (JSON outputs), as the encoder's
/// binary KServe request.
fn pre_tokenized(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    texts: &[String],
) -> anyhow::Result<Vec<(Bytes, usize)>> {
    let mut out = Vec::new();
    for text in texts {
        let (body, n) = binary_request(
            &[("TEXT", "BYTES", vec![1, 1], bytes_element(text.as_bytes()))],
            false,
        );
        let r = rt.block_on(async {
            let mut c = Client::connect(addr).await?;
            c.send(
                "POST",
                "/v2/models/text_tokenize/infer",
                &[("inference-header-content-length", n.to_string())],
                body,
            )
            .await
        })?;
        anyhow::ensure!(r.status == 200, "text_tokenize: HTTP {}", r.status);
        let j = r.json();
        let tensor = |name: &str| -> anyhow::Result<(Vec<i64>, Vec<u8>)> {
            let o = j["outputs"]
                .as_array()
                .and_then(|o| o.iter().find(|o| o["name"] == name))
                .ok_or_else(|| anyhow!("text_tokenize has no output {name}"))?;
            let shape = o["shape"]
                .as_array()
                .map(|s| s.iter().filter_map(|d| d.as_i64()).collect())
                .unwrap_or_default();
            let data = o["data"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|v| v.as_i64().unwrap_or(0).to_le_bytes())
                .collect();
            Ok((shape, data))
        };
        let (shape, ids) = tensor("input_ids")?;
        let (_, mask) = tensor("attention_mask")?;
        let (_, types) = tensor("token_type_ids")?;
        let (body, n) = binary_request(
            &[
                ("input_ids", "INT64", shape.clone(), ids),
                ("attention_mask", "INT64", shape.clone(), mask),
                ("token_type_ids", "INT64", shape, types),
            ],
            true,
        );
        out.push((Bytes::from(body), n));
    }
    Ok(out)
}

/// Starts benches/python_embeddings_server.py; returns it and its address.
fn python_server(root: &Path) -> anyhow::Result<(std::process::Child, std::net::SocketAddr)> {
    let python = std::env::var("WISP_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = std::process::Command::new(&python)
        .arg(root.join("benches/python_embeddings_server.py"))
        .arg(root.join("model_repo/all_minilm_l6_v2/1/model.onnx"))
        .arg(root.join("model_repo/text_tokenize/data/tokenizer.json"))
        .arg("256")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {python} (set WISP_PYTHON; ./dev bench does)"))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("the Python server said {line:?}, not its port"))?;
    Ok((child, ([127, 0, 0, 1], port).into()))
}

/// The tokenizer alone, natively: the same crate and file, one text per call.
fn native_tokenizer(root: &Path, text: &str, secs: f64, cap: usize) -> anyhow::Result<Stats> {
    use tokenizers::{PaddingParams, Tokenizer, TruncationParams};
    let mut t = Tokenizer::from_file(root.join("model_repo/text_tokenize/data/tokenizer.json"))
        .map_err(|e| anyhow!("{e}"))?;
    t.with_truncation(Some(TruncationParams {
        max_length: 256,
        ..Default::default()
    }))
    .map_err(|e| anyhow!("{e}"))?;
    t.with_padding(Some(PaddingParams::default()));
    let run = |t: &Tokenizer| t.encode_batch(vec![text.to_string()], true);
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < secs / 4.0 {
        run(&t).map_err(|e| anyhow!("{e}"))?;
    }
    let mut lat: Vec<Duration> = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs && lat.len() < cap {
        let at = Instant::now();
        std::hint::black_box(run(&t).map_err(|e| anyhow!("{e}"))?);
        lat.push(at.elapsed());
    }
    Ok(stats(lat, start.elapsed()))
}

pub fn suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    backend: &dyn Backend,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    let root = workspace_root();
    let repo = root.join("model_repo");
    for f in [
        "all_minilm_l6_v2/1/model.onnx",
        "text_tokenize/1/model.wasm",
        "text_tokenize/data/tokenizer.json",
        "text_pool/1/model.wasm",
    ] {
        anyhow::ensure!(
            repo.join(f).is_file(),
            "model_repo/{f} is missing: run ./dev bench (it fetches the model and installs the plugins)"
        );
    }
    let texts = texts(&root)?;
    let secs = args.seconds;
    let server = start_server(rt, &repo, engine)?;
    let addr = server.http_addr();
    let (mut python, python_addr) = python_server(&root)?;

    let openai = Target {
        path: "/v1/embeddings".into(),
        binary: false,
        bodies: Arc::new(
            texts
                .iter()
                .map(|t| json_body("text_embedding", t))
                .collect(),
        ),
    };
    let ensemble = Target {
        path: "/v2/models/text_embedding/infer".into(),
        binary: true,
        bodies: Arc::new(
            texts
                .iter()
                .map(|t| {
                    let (b, n) = binary_request(
                        &[("TEXT", "BYTES", vec![1, 1], bytes_element(t.as_bytes()))],
                        true,
                    );
                    (Bytes::from(b), n)
                })
                .collect(),
        ),
    };
    let encoder = Target {
        path: "/v2/models/all_minilm_l6_v2/infer".into(),
        binary: true,
        bodies: Arc::new(pre_tokenized(rt, addr, &texts)?),
    };

    println!(
        "## embeddings: all-MiniLM-L6-v2, one text per request, {} sentences cycled
",
        texts.len()
    );
    println!(
        "| concurrency | (a) /v1/embeddings req/s | (b) ensemble KServe req/s | (c) ONNX alone, pre-tokenized req/s | (d) Python process req/s | p50 µs a / b / c / d | b ÷ c | a ÷ d |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let result = (|| -> anyhow::Result<()> {
        for conc in [1usize, 8, 32] {
            let a = rt.block_on(cycle(addr, &openai, conc, secs, args.max_requests))?;
            let b = rt.block_on(cycle(addr, &ensemble, conc, secs, args.max_requests))?;
            let c = rt.block_on(cycle(addr, &encoder, conc, secs, args.max_requests))?;
            let d = rt.block_on(cycle(python_addr, &openai, conc, secs, args.max_requests))?;
            println!(
                "| {conc} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} / {:.0} / {:.0} / {:.0} | {:.2} | {:.2} |",
                a.rps,
                b.rps,
                c.rps,
                d.rps,
                us(a.p50),
                us(b.p50),
                us(c.p50),
                us(d.p50),
                b.rps / c.rps,
                a.rps / d.rps
            );
        }
        Ok(())
    })();
    let _ = python.kill();
    let _ = python.wait();
    rt.block_on(server.shutdown())?;
    result?;

    // The encoder's ceiling: one instance in-process, a batch of the same mid-length text.
    let mid = &texts[texts.len() / 2];
    let (ids_shape, encoder_input) = {
        let (body, n) = &encoder.bodies[texts.len() / 2];
        let j: serde_json::Value = serde_json::from_slice(&body[..*n])?;
        let shape: Vec<i64> = j["inputs"][0]["shape"]
            .as_array()
            .map(|s| s.iter().filter_map(|d| d.as_i64()).collect())
            .unwrap_or_default();
        let len = shape.iter().product::<i64>() as usize * 8;
        let data = &body[*n..];
        let input: Vec<(&'static str, &'static str, Vec<i64>, Vec<u8>)> =
            ["input_ids", "attention_mask", "token_type_ids"]
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    (
                        *name,
                        "INT64",
                        shape.clone(),
                        data[i * len..(i + 1) * len].to_vec(),
                    )
                })
                .collect();
        (shape, input)
    };
    println!(
        "
## embeddings (c'): the encoder in-process, one instance, batches of one {}-token text
",
        ids_shape.last().copied().unwrap_or(0)
    );
    println!("| batch | texts/s | p50 µs per batch |");
    println!("|---|---|---|");
    for batch in [1usize, 8, 32] {
        let s = in_process(
            backend,
            "all_minilm_l6_v2",
            &repo,
            &encoder_input,
            batch,
            secs,
            args.max_requests,
        )?;
        println!("| {batch} | {:.0} | {:.0} |", s.rps, us(s.p50));
    }

    println!(
        "
## embeddings (e): the tokenizer step alone, one text per call ({:?})
",
        mid
    );
    println!("| tokenizer | p50 µs | p99 µs | calls/s | p50 vs native |");
    println!("|---|---|---|---|---|");
    let wasm = wisp_plugin_runtime::WasmBackend::new(Default::default(), None);
    let text_input = vec![(
        "TEXT",
        "BYTES",
        vec![1i64, 1],
        bytes_element(mid.as_bytes()),
    )];
    let in_wasm = in_process(
        &wasm,
        "text_tokenize",
        &repo,
        &text_input,
        1,
        secs,
        args.max_requests,
    )?;
    let native = native_tokenizer(&root, mid, secs, args.max_requests)?;
    for (what, s) in [
        ("native (tokenizers crate)", &native),
        ("wasm plugin (text_tokenize)", &in_wasm),
    ] {
        println!(
            "| {what} | {:.1} | {:.1} | {:.0} | {:.2}× |",
            us(s.p50),
            us(s.p99),
            s.rps,
            us(s.p50) / us(native.p50)
        );
    }
    Ok(())
}
