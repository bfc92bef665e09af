//! The http, batching and swap suites: Wisp over HTTP against the backend in-process, the dynamic batcher, and a model swapped under load.

use super::*;

pub(super) fn http_suite(
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
pub(super) fn ppocr_variant(extra: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let m = dir.path().join("ppocr_cls");
    wisp_tests::copy_dir(&workspace_root().join("model_repo/ppocr_cls"), &m)?;
    let cfg = std::fs::read_to_string(m.join("config.pbtxt"))?;
    std::fs::write(m.join("config.pbtxt"), format!("{cfg}\n{extra}\n"))?;
    Ok(dir)
}

pub(super) fn batching_suite(
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

/// Longest gap between consecutive completed requests (all clients merged) while `reloads`
/// reloads of `add_sub` happen (0 = the baseline), over HTTP with 4 clients.
pub(super) async fn longest_gap(
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

pub(super) fn swap_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
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
