//! The languages suite: the same plugin in Rust, Python and JavaScript.

use super::*;

/// The add/sub plugin built in each language (by `./dev plugins`).
pub(super) fn language_plugins() -> Vec<(&'static str, &'static str, PathBuf)> {
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

pub(super) const ADD_SUB_WASM_CONFIG: &str = r#"backend: "wasm"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"#;

pub(super) fn languages_suite(
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
