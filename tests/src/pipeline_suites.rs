//! The pipelines and trace suites: the demo ensembles end to end, and tracing's cost.

use super::*;
use crate::plugin_suites::client_side;

/// One pipeline of the demo repository: its steps alone and its pipeline forms.
pub(super) struct PipelineBench {
    title: String,
    steps: Vec<(String, Model)>,
    pipelines: Vec<(String, Model)>,
    /// Also measure pre/post-processing in the client (text direction only).
    client_side: Option<Arc<Vec<u8>>>,
}

/// A JSON array of numbers as little-endian bytes, each number converted by `le`.
pub(super) fn json_le<const N: usize>(
    v: &serde_json::Value,
    le: fn(&serde_json::Value) -> [u8; N],
) -> Vec<u8> {
    v.as_array().into_iter().flatten().flat_map(le).collect()
}

/// Runs `model` once over HTTP with JSON outputs and returns output `name` as raw LE bytes.
pub(super) fn output_bytes(
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
pub(super) fn pipeline_row(what: &str, concurrency: usize, s: &Stats) {
    println!(
        "| {what} | {concurrency} | {:.0} | {:.0} | {:.0} |",
        s.rps,
        us(s.p50),
        us(s.p99)
    );
}

pub(super) fn pipelines_suite(
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

pub(super) fn trace_suite(
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
