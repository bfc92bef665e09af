//! The plugins suite: a wasm step's cost against native code, per request and per batch.

use super::*;

pub(super) fn plugins_suite(
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

pub(super) async fn client_side_once(
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
pub(super) async fn client_side(
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
