//! Dynamic batching, statistics, metrics, response cache and warm-up through the real server.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wisp_server::settings::OnnxEngine;
use wisp_tests::{copy_dir, fixture_repo, Client};

use crate::common::{start_with, testkit_config};

fn add_sub_request(seed: f32) -> Value {
    let a: Vec<f32> = (0..16).map(|i| i as f32 + seed).collect();
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        ]
    })
}

/// A copy of add_sub whose config gets `extra` appended.
fn repo_with(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("add_sub");
    copy_dir(&fixture_repo().join("add_sub"), &m).unwrap();
    let cfg = std::fs::read_to_string(m.join("config.pbtxt")).unwrap();
    std::fs::write(m.join("config.pbtxt"), format!("{cfg}\n{extra}\n")).unwrap();
    dir
}

/// The value of one sample line of a Prometheus text page.
fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (head, value) = l.rsplit_once(' ')?;
        let (n, rest) = head.split_once('{').unwrap_or((head, ""));
        if n != name {
            return None;
        }
        labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.parse().ok())?
    })
}

async fn stats_of(c: &mut Client, model: &str) -> Value {
    let r = c
        .get(&format!("/v2/models/{model}/versions/1/stats"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["model_stats"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_form_one_batch_and_get_their_own_answers() {
    // a preferred size of 4 with a long delay: the batch leaves exactly when 4 are queued
    let dir = repo_with(
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }",
    );
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let addr = server.http_addr();
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let r = c
                .post_json(
                    "/v2/models/add_sub/infer",
                    &add_sub_request(i as f32 * 100.0),
                )
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let out = r.json()["outputs"][0]["data"].clone();
            let want: Vec<f64> = (0..16).map(|j| j as f64 + i as f64 * 100.0 + 1.0).collect();
            assert_eq!(out, json!(want), "request {i} got another request's rows");
        }));
    }
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(30), t)
            .await
            .unwrap()
            .unwrap();
    }
    let mut c = Client::connect(addr).await.unwrap();
    let s = stats_of(&mut c, "add_sub").await;
    assert_eq!(s["execution_count"], 1);
    assert_eq!(s["inference_count"], 4);
    assert_eq!(s["batch_stats"][0]["batch_size"], 4);
    assert_eq!(s["inference_stats"]["success"]["count"], 4);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_metrics_count_known_traffic() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.metrics_port = 0;
        s.metrics_config = vec!["summary_latencies=true".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for i in 0..5 {
        let r = c
            .post_json("/v2/models/add_sub/infer", &add_sub_request(i as f32))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let mut bad = add_sub_request(0.0);
    bad["inputs"][0]["shape"] = json!([1, 3]);
    for _ in 0..2 {
        assert_eq!(
            c.post_json("/v2/models/add_sub/infer", &bad)
                .await
                .unwrap()
                .status,
            400
        );
    }
    let s = stats_of(&mut c, "add_sub").await;
    assert_eq!(s["name"], "add_sub");
    assert_eq!(s["version"], "1");
    assert_eq!(s["inference_stats"]["success"]["count"], 5);
    assert_eq!(s["inference_stats"]["fail"]["count"], 2);
    assert_eq!(s["inference_stats"]["queue"]["count"], 5);
    assert_eq!(s["inference_stats"]["compute_infer"]["count"], 5);
    assert!(
        s["inference_stats"]["compute_infer"]["ns"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(s["inference_count"], 5);
    assert_eq!(s["execution_count"], 5);
    assert!(s["last_inference"].as_u64().unwrap() > 1_700_000_000_000);
    // all models and per model
    let all = c.get("/v2/models/stats").await.unwrap().json();
    let names: Vec<&str> = all["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"add_sub") && names.contains(&"classifier"));
    assert_eq!(
        c.get("/v2/models/add_sub/stats").await.unwrap().json()["model_stats"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(c.get("/v2/models/nope/stats").await.unwrap().status, 404);
    assert_eq!(
        c.get("/v2/models/add_sub/versions/9/stats")
            .await
            .unwrap()
            .status,
        404
    );

    let mut m = Client::connect(server.metrics_addr().unwrap())
        .await
        .unwrap();
    let page = String::from_utf8(m.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    let l = [("model", "add_sub"), ("version", "1")];
    assert_eq!(
        sample(&page, "nv_inference_request_success", &l),
        Some(5.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            "nv_inference_request_failure",
            &[("model", "add_sub"), ("reason", "OTHER")]
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &page,
            "nv_inference_request_failure",
            &[("model", "add_sub"), ("reason", "REJECTED")]
        ),
        Some(0.0)
    );
    assert_eq!(sample(&page, "nv_inference_count", &l), Some(5.0));
    assert_eq!(sample(&page, "nv_inference_exec_count", &l), Some(5.0));
    assert_eq!(
        sample(&page, "nv_inference_pending_request_count", &l),
        Some(0.0)
    );
    assert!(sample(&page, "nv_inference_request_duration_us", &l).unwrap() > 0.0);
    assert!(sample(&page, "nv_inference_queue_duration_us", &l).is_some());
    assert!(sample(&page, "nv_inference_compute_infer_duration_us", &l).is_some());
    assert!(sample(&page, "nv_model_load_duration_secs", &l).unwrap() > 0.0);
    assert!(
        sample(
            &page,
            "nv_inference_request_summary_us",
            &[("model", "add_sub"), ("quantile", "0.5")]
        )
        .unwrap()
            > 0.0
    );
    assert!(sample(
        &page,
        "nv_inference_compute_infer_summary_us",
        &[("model", "add_sub"), ("quantile", "0.99")]
    )
    .is_some());
    assert!(sample(&page, "nv_cpu_memory_total_bytes", &[]).unwrap() > 0.0);
    assert!(sample(&page, "nv_cpu_utilization", &[]).is_some());
    assert!(page.contains("# HELP nv_inference_request_success"));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_cache_serves_repeats_and_counts_hits() {
    let dir = repo_with("response_cache { enable: true }");
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.metrics_port = 0;
        s.cache_config = vec!["local,size=1048576".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let first = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(1.0))
        .await
        .unwrap()
        .json();
    let second = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(1.0))
        .await
        .unwrap()
        .json();
    assert_eq!(first["outputs"], second["outputs"]);
    c.post_json("/v2/models/add_sub/infer", &add_sub_request(2.0))
        .await
        .unwrap();
    let s = stats_of(&mut c, "add_sub").await;
    assert_eq!(s["inference_stats"]["cache_hit"]["count"], 1);
    assert_eq!(s["inference_stats"]["cache_miss"]["count"], 2);
    assert_eq!(s["inference_stats"]["success"]["count"], 3);
    assert_eq!(s["inference_count"], 2, "cache hits are not inferences");
    let mut m = Client::connect(server.metrics_addr().unwrap())
        .await
        .unwrap();
    let page = String::from_utf8(m.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    assert_eq!(
        sample(
            &page,
            "nv_cache_num_hits_per_model",
            &[("model", "add_sub")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &page,
            "nv_cache_num_misses_per_model",
            &[("model", "add_sub")]
        ),
        Some(2.0)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_runs_before_ready_and_a_failing_warmup_blocks_the_model() {
    let ok = repo_with(
        r#"model_warmup [ { name: "zeros" batch_size: 2 count: 3 inputs [ { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }, { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } ] } ]"#,
    );
    let server = start_with(ok.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(c.get("/v2/models/add_sub/ready").await.unwrap().status, 200);
    assert_eq!(
        stats_of(&mut c, "add_sub").await["execution_count"],
        0,
        "warm-up is not traffic"
    );
    server.shutdown().await.unwrap();

    // a data file of the wrong size makes the warm-up, and so the model, fail
    let bad = repo_with(
        r#"model_warmup [ { name: "file" batch_size: 1 inputs [ { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "short.bin" } }, { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } ] } ]"#,
    );
    std::fs::create_dir_all(bad.path().join("add_sub/warmup")).unwrap();
    std::fs::write(bad.path().join("add_sub/warmup/short.bin"), [0u8; 10]).unwrap();
    let server = start_with(bad.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(0.0))
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("warmup sample 'file'"), "{msg}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_at_once() {
    // one instance, queue of 1, and a long batching delay holding the first request queued
    let dir = repo_with(
        "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 3000000 default_queue_policy { max_queue_size: 1 } }",
    );
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let addr = server.http_addr();
    // Two requests race for the one queue slot: whichever wins is held by the batching delay
    // and then served; the other is refused at once. (Sending one after another in a loop
    // could stall: a loop request that won the slot waited out the delay each time.)
    let send = |x: f32| {
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let start = Instant::now();
            let r = c
                .post_json("/v2/models/add_sub/infer", &add_sub_request(x))
                .await
                .unwrap();
            (r.status, r.json(), start.elapsed())
        })
    };
    let first = send(0.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = send(1.0);
    let mut answers = vec![first.await.unwrap(), second.await.unwrap()];
    answers.sort_by_key(|a| a.0);
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 503], "{answers:?}");
    let (_, refused, waited) = &answers[1];
    let msg = refused["error"].as_str().unwrap();
    assert!(msg.contains("Exceeds maximum queue size"), "{msg}");
    assert!(
        *waited < Duration::from_secs(2),
        "the refusal waited {waited:?}: it should come at once"
    );
    let mut c = Client::connect(addr).await.unwrap();
    let s = stats_of(&mut c, "add_sub").await;
    assert!(s["inference_stats"]["fail"]["count"].as_u64().unwrap() >= 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_policies_pin_instances_and_unknown_ones_are_reported() {
    let dir = repo_with("");
    let m = dir.path().join("add_sub/config.pbtxt");
    let cfg = std::fs::read_to_string(&m).unwrap();
    std::fs::write(
        &m,
        cfg.replace("count: 1", "count: 2 host_policy: \"pinned\""),
    )
    .unwrap();
    copy_dir(
        &fixture_repo().join("classifier"),
        &dir.path().join("classifier"),
    )
    .unwrap();
    let c2 = dir.path().join("classifier/config.pbtxt");
    let text = std::fs::read_to_string(&c2).unwrap();
    std::fs::write(
        &c2,
        format!("{text}\ninstance_group [ {{ kind: KIND_CPU host_policy: \"nowhere\" }} ]\n"),
    )
    .unwrap();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.host_policy = vec!["pinned,cpu-cores=0-0".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for i in 0..4 {
        let r = c
            .post_json("/v2/models/add_sub/infer", &add_sub_request(i as f32))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let x = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": vec![0.5f32; 8]}]});
    let r = c
        .post_json("/v2/models/classifier/infer", &x)
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("host_policy 'nowhere' is not defined"));
    server.shutdown().await.unwrap();
}

/// A REJECT queue timeout is answered when it passes, while the model's one instance is still
/// busy with another request (a plugin spinning until its 2 s deadline), not after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_timeout_is_answered_while_the_instance_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(&format!(
        r#"instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ default_queue_policy {{ default_timeout_microseconds: 200000 }} }}
{}"#,
        wisp_tests::config_param("wasm.timeout_ms", "2000")
    ));
    wisp_tests::add_plugin_model(dir.path(), "busy", 1, "testkit", &config);
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let addr = server.http_addr();
    let request = |mode: &str| {
        json!({
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}],
            "parameters": {"mode": mode},
        })
    };
    let spinning = {
        let body = request("loop");
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            c.post_json("/v2/models/busy/infer", &body).await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = Client::connect(addr).await.unwrap();
    let start = Instant::now();
    let r = c
        .post_json("/v2/models/busy/infer", &request("identity"))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("Request timeout expired"), "{msg}");
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(
        !spinning.is_finished(),
        "answered only after the busy instance freed up ({waited:?})"
    );
    let spun = spinning.await.unwrap();
    assert_eq!(spun.status, 503, "{}", String::from_utf8_lossy(&spun.body));
    let r = c
        .post_json("/v2/models/busy/infer", &request("identity"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let s = stats_of(&mut c, "busy").await;
    assert_eq!(s["inference_stats"]["fail"]["count"], 2, "{s}");
    server.shutdown().await.unwrap();
}

/// The largest `timeout` a request can give, to a model whose REJECT queue lets requests set
/// it with no default (so a timeout thread runs, and the deadline is 2^64 µs away): the
/// request is served. One past it, or a negative one, is a 400 naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extreme_queue_timeout_is_served_or_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = testkit_config(
        "dynamic_batching { default_queue_policy { allow_timeout_override: true } }",
    );
    wisp_tests::add_plugin_model(dir.path(), "lenient", 1, "testkit", &config);
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for (timeout, status) in [
        ("18446744073709551615", 200),
        ("18446744073709551616", 400),
        ("-1", 400),
    ] {
        // Written out as text: a JSON value would not keep the number past u64 exactly.
        let body = format!(
            r#"{{"inputs": [{{"name": "INPUT", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}}],
                "parameters": {{"timeout": {timeout}}}}}"#
        );
        let json = [("content-type", "application/json".to_string())];
        let r = c
            .send("POST", "/v2/models/lenient/infer", &json, body)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            status,
            "timeout {timeout}: {}",
            String::from_utf8_lossy(&r.body)
        );
        if status == 400 {
            let msg = r.json()["error"].as_str().unwrap().to_string();
            assert!(msg.contains("'timeout'"), "{msg}");
        } else {
            assert_eq!(r.json()["outputs"][0]["data"], json!([1, 2]));
        }
    }
    server.shutdown().await.unwrap();
}
