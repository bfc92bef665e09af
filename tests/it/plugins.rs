//! Wasm plugins served as models, with real compiled components from `plugins/`: the example
//! plugins, a plugin calling an ONNX model through wasi-nn, hot replacement, misbehaving
//! plugins (loop, memory bomb, panic, bad outputs, bad init) and the sandbox.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wisp_server::settings::{ControlMode, OnnxEngine, WasmCompilerChoice};
use wisp_tests::{add_plugin_model, copy_dir, workspace_root, Client};

use crate::common::{start_with, testkit_config};

use wisp_tests::config_param as param;

fn int_request(values: [i32; 2]) -> Value {
    json!({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 2], "data": values}]})
}

async fn infer_image(c: &mut Client, model: &str, bytes: &[u8]) -> wisp_tests::Reply {
    wisp_tests::infer_one_bytes(c, model, "IMAGE", bytes)
        .await
        .unwrap()
}

fn solid_png(rgb: [u8; 3]) -> Vec<u8> {
    plugin_imaging::encode_png(6, 4, |_, _| rgb)
}

async fn start_plugins(repo: &Path) -> wisp_server::Server {
    start_with(repo, OnnxEngine::Tract, |s| s.no_wasm_cache = true).await
}

fn error_text(r: &wisp_tests::Reply) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_plugins_serve_as_models() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(
        dir.path(),
        "preprocess",
        1,
        "image-preprocess",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] }} ]
dynamic_batching {{ }}
{}{}{}{}"#,
            param("width", "4"),
            param("height", "4"),
            param("mean", "0"),
            param("std", "1")
        ),
    );
    add_plugin_model(
        dir.path(),
        "postprocess",
        1,
        "classify-postprocess",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 2 ] }} ]
{}{}"#,
            param("top_k", "2"),
            param("labels", "red,green,blue")
        ),
    );
    let server = start_plugins(dir.path()).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();

    let meta = c.get("/v2/models/preprocess").await.unwrap().json();
    assert_eq!(meta["parameters"]["engine"], "wasmtime", "{meta}");

    let r = infer_image(&mut c, "preprocess", &solid_png([255, 0, 0])).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = &r.json()["outputs"][0];
    assert_eq!(out["name"], "PIXELS");
    assert_eq!(out["shape"], json!([1, 3, 4, 4]));
    let v: Vec<f64> = serde_json::from_value(out["data"].clone()).unwrap();
    assert!(v[..16].iter().all(|&x| (x - 1.0).abs() < 1e-6), "{v:?}");
    assert!(v[16..].iter().all(|&x| x.abs() < 1e-6), "{v:?}");

    let r = infer_image(&mut c, "preprocess", b"definitely not a png").await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(error_text(&r).contains("image 0"), "{}", error_text(&r));

    let r = c
        .post_json(
            "/v2/models/postprocess/infer",
            &json!({"inputs": [{"name": "SCORES", "datatype": "FP32", "shape": [2, 3],
                     "data": [0.1, 0.7, 0.2, 0.5, 0.2, 0.3]}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = &r.json()["outputs"][0];
    assert_eq!(out["shape"], json!([2, 2]));
    assert_eq!(
        out["data"],
        json!([
            "0.700000:1:green",
            "0.200000:2:blue",
            "0.500000:0:red",
            "0.300000:2:blue"
        ])
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_calls_an_onnx_model_through_wasi_nn() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(
        &workspace_root().join("tests/fixtures/vision/colors"),
        &dir.path().join("colors"),
    )
    .unwrap();
    add_plugin_model(
        dir.path(),
        "classify",
        1,
        "classify-image",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] }} ]
{}{}{}{}{}{}"#,
            param("model", "colors"),
            param("width", "4"),
            param("height", "4"),
            param("mean", "0"),
            param("std", "1"),
            param("labels", "red,green,blue")
        ),
    );
    let server = start_plugins(dir.path()).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for (rgb, label) in [
        ([0, 0, 255], "blue"),
        ([0, 200, 0], "green"),
        ([250, 10, 10], "red"),
    ] {
        let r = infer_image(&mut c, "classify", &solid_png(rgb)).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let class = r.json()["outputs"][0]["data"][0]
            .as_str()
            .unwrap()
            .to_string();
        assert!(class.ends_with(&format!(":{label}")), "{rgb:?}: {class}");
    }
    // The wasi-nn calls went through the ONNX model's own scheduler and statistics.
    let stats = c.get("/v2/models/colors/stats").await.unwrap().json();
    assert_eq!(stats["model_stats"][0]["inference_count"], 3, "{stats}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_nn_errors_reach_the_client() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(
        dir.path(),
        "classify",
        1,
        "classify-image",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] }} ]
{}{}{}"#,
            param("model", "missing_model"),
            param("width", "4"),
            param("height", "4")
        ),
    );
    let server = start_plugins(dir.path()).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = infer_image(&mut c, "classify", &solid_png([1, 2, 3])).await;
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        error_text(&r).contains("missing_model"),
        "{}",
        error_text(&r)
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_replacement_of_a_plugin_version() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(dir.path(), "echo", 1, "testkit", &testkit_config(""));
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["echo".into()];
        s.no_wasm_cache = true;
    })
    .await;
    let addr = server.http_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let (mut ok, mut last) = (0u32, 0u64);
            let started = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && ok < 100_000
                && started.elapsed() < Duration::from_secs(60)
            {
                let r = c
                    .post_json("/v2/models/echo/infer", &int_request([1, 2]))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let j = r.json();
                assert_eq!(j["outputs"][0]["data"], json!([1, 2]));
                let v: u64 = j["model_version"].as_str().unwrap().parse().unwrap();
                assert!(v >= last, "version went back from {last} to {v}");
                last = v;
                ok += 1;
            }
            (ok, last)
        }));
    }
    let mut c = Client::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for v in 2..=3u64 {
        add_plugin_model(dir.path(), "echo", v, "testkit", &testkit_config(""));
        let r = c
            .send("POST", "/v2/repository/models/echo/load", &[], "{}")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for h in clients {
        let (ok, last) = h.await.unwrap();
        assert!(ok > 0);
        assert_eq!(last, 3);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_plugins_fail_only_their_own_requests() {
    misbehaving_plugins(WasmCompilerChoice::Native).await;
}

/// The sandbox's limits hold the same on Pulley, the interpreter riscv64 runs plugins on:
/// deadlines, memory, fuel and traps each fail only their own request, with the same errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_plugins_fail_only_their_own_requests_on_pulley() {
    misbehaving_plugins(WasmCompilerChoice::Pulley).await;
}

async fn misbehaving_plugins(compiler: WasmCompilerChoice) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    add_plugin_model(repo, "good", 1, "testkit", &testkit_config(""));
    add_plugin_model(
        repo,
        "looping",
        1,
        "testkit",
        &testkit_config(&(param("mode", "loop") + &param("wasm.timeout_ms", "300"))),
    );
    add_plugin_model(
        repo,
        "bomb",
        1,
        "testkit",
        &testkit_config(&(param("mode", "bomb") + &param("wasm.memory_limit_mb", "64"))),
    );
    add_plugin_model(
        repo,
        "fuel",
        1,
        "testkit",
        &testkit_config(&(param("mode", "loop") + &param("wasm.fuel", "1000000"))),
    );
    add_plugin_model(
        repo,
        "trapping",
        1,
        "testkit",
        &testkit_config(&param("mode", "trap")),
    );
    add_plugin_model(
        repo,
        "bad_shape",
        1,
        "testkit",
        &testkit_config(&param("mode", "bad_shape")),
    );
    add_plugin_model(
        repo,
        "bad_type",
        1,
        "testkit",
        &testkit_config(&param("mode", "bad_type")),
    );
    add_plugin_model(
        repo,
        "bad_init",
        1,
        "testkit",
        &testkit_config(&param("fail_init", "true")),
    );
    let server = start_with(repo, OnnxEngine::Tract, |s| {
        s.no_wasm_cache = true;
        s.wasm_compiler = compiler;
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();

    // A broken init makes only that model unavailable, with the plugin's reason.
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    for row in idx.as_array().unwrap() {
        if row["name"] == "bad_init" {
            assert_eq!(row["state"], "UNAVAILABLE");
            let reason = row["reason"].as_str().unwrap();
            assert!(
                reason.contains("init failed") && reason.contains("fail_init"),
                "{reason}"
            );
        } else {
            assert_eq!(row["state"], "READY", "{row}");
        }
    }

    // While one plugin spins until its deadline, the others keep serving.
    let addr = server.http_addr();
    let spinning = tokio::spawn(async move {
        let mut c = Client::connect(addr).await.unwrap();
        let t = Instant::now();
        let r = c
            .post_json("/v2/models/looping/infer", &int_request([1, 2]))
            .await
            .unwrap();
        (r, t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..5 {
        let r = c
            .post_json("/v2/models/good/infer", &int_request([5, 6]))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let (r, took) = spinning.await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let msg = error_text(&r);
    assert!(
        msg.contains("'looping'") && msg.contains("deadline of 300 ms"),
        "{msg}"
    );
    assert!(
        took < Duration::from_secs(5),
        "deadline fired late: {took:?}"
    );

    let cases = [
        ("bomb", 500, "memory limit of 64 MiB"),
        ("fuel", 500, "ran out of fuel"),
        ("trapping", 500, "deliberate panic"),
        ("bad_shape", 500, "shape [1, 3]"),
        ("bad_type", 500, "as BYTES, the config declares TYPE_INT32"),
        ("bad_init", 503, "bad_init"),
    ];
    for (model, status, needle) in cases {
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &int_request([1, 2]))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            status,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let msg = error_text(&r);
        assert!(msg.contains(needle), "{model}: {msg}");
    }

    // A trapped instance is replaced: the same model answers a well-behaved request.
    let mut ok = int_request([7, 8]);
    ok["parameters"] = json!({"mode": "identity"});
    for model in ["trapping", "looping", "bomb"] {
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &ok)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["outputs"][0]["data"], json!([7, 8]));
    }

    // Each failure is counted with its reason.
    let mut m = Client::connect(server.metrics_addr().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(m.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    for (model, reason) in [
        ("looping", "deadline"),
        ("bomb", "memory"),
        ("fuel", "fuel"),
        ("trapping", "trap"),
        ("bad_shape", "bad_output"),
        ("bad_type", "bad_output"),
        ("bad_init", "init"),
    ] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("wisp_plugin_failure_total{")
                    && l.contains(&format!("model=\"{model}\""))
                    && l.contains(&format!("reason=\"{reason}\""))
            })
            .unwrap_or_else(|| panic!("no {model}/{reason} failure in\n{text}"));
        assert!(line.ends_with(" 1"), "{line}");
    }
    server.shutdown().await.unwrap();
}

fn probe_config(extra: &str) -> String {
    format!(
        r#"backend: "wasm"
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
{}{extra}"#,
        param("mode", "probe")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_grants_nothing_unless_configured() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(dir.path(), "closed", 1, "testkit", &probe_config(""));
    add_plugin_model(
        dir.path(),
        "open",
        1,
        "testkit",
        &probe_config(
            &(param("wasm.allow_env", "WISP_PLUGIN_TEST_SECRET")
                + &param("wasm.allow_clock", "true")
                + &param("wasm.allow_read_dir", "assets")),
        ),
    );
    std::fs::create_dir(dir.path().join("open/assets")).unwrap();
    std::fs::write(dir.path().join("open/assets/hello.txt"), "hi").unwrap();
    // The server's environment, injected: the variable exists only for this server.
    let env = std::collections::HashMap::from([(
        "WISP_PLUGIN_TEST_SECRET".to_string(),
        "hunter2".to_string(),
    )]);
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.no_wasm_cache = true;
        s.env = std::sync::Arc::new(env);
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let probe = |j: Value| j["outputs"][0]["data"][0].as_str().unwrap().to_string();
    let closed = c
        .post_json(
            "/v2/models/closed/infer",
            &json!({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2], "data": [0, 0]}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        closed.status,
        200,
        "{}",
        String::from_utf8_lossy(&closed.body)
    );
    let closed = probe(closed.json());
    assert!(closed.starts_with("fs=error("), "{closed}");
    assert!(closed.contains(";root=error("), "{closed}");
    assert!(closed.contains(";env=;"), "{closed}");
    assert!(closed.ends_with(";clock=0"), "{closed}");
    assert!(!closed.contains("hunter2"));

    let open = c
        .post_json(
            "/v2/models/open/infer",
            &json!({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2], "data": [0, 0]}]}),
        )
        .await
        .unwrap();
    let open = probe(open.json());
    assert!(open.starts_with("fs=hello.txt;"), "{open}");
    assert!(
        open.contains("env=WISP_PLUGIN_TEST_SECRET=hunter2;"),
        "{open}"
    );
    let secs: u64 = open.rsplit("clock=").next().unwrap().parse().unwrap();
    assert!(secs > 1_600_000_000, "{open}");
    server.shutdown().await.unwrap();
}

/// A wasm plugin keeping per-sequence state in its own memory behind the sequence batcher:
/// interleaved sequences from concurrent clients on two instances each get their own totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_plugin_keeps_each_sequence_apart() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(
        dir.path(),
        "running_sum",
        1,
        "sequence-sum",
        r#"backend: "wasm"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
sequence_batching {
  oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 200 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"#,
    );
    let server = start_plugins(dir.path()).await;
    let addr = server.http_addr();
    let mut clients = Vec::new();
    for id in 1..=6u64 {
        clients.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let mut sums = Vec::new();
            for step in 0..5u64 {
                let body = json!({
                    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1],
                                "data": [(id * 10 + step) as f32]}],
                    "parameters": {"sequence_id": id, "sequence_start": step == 0,
                                   "sequence_end": step == 4}
                });
                let r = c
                    .post_json("/v2/models/running_sum/infer", &body)
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", error_text(&r));
                sums.push(r.json()["outputs"][0]["data"][0].as_f64().unwrap());
            }
            (id, sums)
        }));
    }
    for client in clients {
        let (id, sums) = client.await.unwrap();
        let want: Vec<f64> = (0..5u64)
            .scan(0.0, |total, step| {
                *total += (id * 10 + step) as f64;
                Some(*total)
            })
            .collect();
        assert_eq!(sums, want, "sequence {id}");
    }
    // after END, a continuation is refused with Triton's message
    let mut c = Client::connect(addr).await.unwrap();
    let r = c
        .post_json(
            "/v2/models/running_sum/infer",
            &json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
                    "parameters": {"sequence_id": 3}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(
        error_text(&r).contains("must specify the START flag"),
        "{}",
        error_text(&r)
    );
    server.shutdown().await.unwrap();
}

/// A testkit model of `datatype` and `dims` (INPUT → OUTPUT) with `extra` config lines.
fn typed_testkit(datatype: &str, dims: &str, extra: &str) -> String {
    format!(
        r#"backend: "wasm"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: {datatype} dims: {dims} }} ]
output [ {{ name: "OUTPUT" data_type: {datatype} dims: {dims} }} ]
{extra}"#
    )
}

/// A forwarding testkit: each batch goes to `target` in one `wisp:plugin/models` call.
fn forward(datatype: &str, dims: &str, target: &str) -> String {
    typed_testkit(
        datatype,
        dims,
        &format!(
            "dynamic_batching {{ max_queue_delay_microseconds: 20000 }}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{}{}",
            param("mode", "forward"),
            param("forward_to", target)
        ),
    )
}

/// An INT32 `INPUT` → `OUTPUT` ensemble `name` of one step, `step`.
fn one_step_ensemble(repo: &Path, name: &str, step: &str) {
    std::fs::create_dir_all(repo.join(name).join("1")).unwrap();
    std::fs::write(
        repo.join(name).join("config.pbtxt"),
        format!(
            r#"platform: "ensemble"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT" value: "INPUT" }} output_map {{ key: "OUTPUT" value: "OUTPUT" }} }} ] }}
"#
        ),
    )
    .unwrap();
}

/// `wisp:plugin@0.2.0`: 0.1.0 and 0.2.0 components side by side, and the `models` import —
/// calls carrying BYTES and BOOL, to an ensemble, to another plugin and to a 0.1.0 one,
/// batched into the called model's scheduler, with self-calls and cycles refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_call_models_with_full_requests_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    let int = ("TYPE_INT32", "[ 2 ]");
    add_plugin_model(
        repo,
        "legacy",
        1,
        "legacy-v1",
        &typed_testkit(int.0, int.1, ""),
    );
    add_plugin_model(
        repo,
        "identity",
        1,
        "testkit",
        &typed_testkit(
            int.0,
            int.1,
            "dynamic_batching { max_queue_delay_microseconds: 20000 }\ninstance_group [ { count: 1 kind: KIND_CPU } ]",
        ),
    );
    add_plugin_model(
        repo,
        "fwd",
        1,
        "testkit",
        &forward(int.0, int.1, "identity"),
    );
    add_plugin_model(
        repo,
        "fwd_legacy",
        1,
        "testkit",
        &forward(int.0, int.1, "legacy"),
    );
    add_plugin_model(
        repo,
        "strings",
        1,
        "testkit",
        &typed_testkit("TYPE_STRING", "[ 2 ]", ""),
    );
    add_plugin_model(
        repo,
        "fwd_strings",
        1,
        "testkit",
        &forward("TYPE_STRING", "[ 2 ]", "strings"),
    );
    add_plugin_model(
        repo,
        "bools",
        1,
        "testkit",
        &typed_testkit("TYPE_BOOL", "[ 2 ]", ""),
    );
    add_plugin_model(
        repo,
        "fwd_bools",
        1,
        "testkit",
        &forward("TYPE_BOOL", "[ 2 ]", "bools:1"),
    );
    one_step_ensemble(repo, "ens", "legacy");
    // the last is an ensemble whose step calls back into it
    for (model, target) in [
        ("fwd_ens", "ens"),
        ("itself", "itself"),
        ("cycle_a", "cycle_b"),
        ("cycle_b", "cycle_a"),
        ("back", "ens_loop"),
    ] {
        add_plugin_model(repo, model, 1, "testkit", &forward(int.0, int.1, target));
    }
    one_step_ensemble(repo, "ens_loop", "back");
    let server = start_plugins(repo).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();

    for model in ["legacy", "fwd", "fwd_legacy", "fwd_ens"] {
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &int_request([7, -3]))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["outputs"][0]["data"], json!([7, -3]), "{model}");
    }
    let r = c
        .post_json(
            "/v2/models/fwd_strings/infer",
            &json!({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 2],
                     "data": ["héllo", ""]}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"], json!(["héllo", ""]));
    let r = c
        .post_json(
            "/v2/models/fwd_bools/infer",
            &json!({"inputs": [{"name": "INPUT", "datatype": "BOOL", "shape": [1, 2],
                     "data": [true, false]}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"], json!([true, false]));

    // Calls that would wait on themselves are refused at once, naming the path.
    for (model, named) in [
        ("itself", "itself"),
        ("cycle_a", "cycle_a → cycle_b → cycle_a"),
        ("ens_loop", "ens_loop → back → ens_loop"),
    ] {
        let t = Instant::now();
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &int_request([1, 2]))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            400,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let e = error_text(&r);
        assert!(
            e.contains("already on this call's path") && e.contains(named),
            "{model}: {e}"
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{model} waited");
    }

    // A plugin's batch reaches the called model as one call: under concurrent load the called
    // model runs fewer batches than it receives requests.
    let before = c
        .get("/v2/models/identity/versions/1/stats")
        .await
        .unwrap()
        .json()["model_stats"][0]
        .clone();
    let addr = server.http_addr();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await.unwrap();
                let r = c
                    .post_json("/v2/models/fwd/infer", &int_request([i, i + 1]))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                assert_eq!(r.json()["outputs"][0]["data"], json!([i, i + 1]));
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = c
        .get("/v2/models/identity/versions/1/stats")
        .await
        .unwrap()
        .json()["model_stats"][0]
        .clone();
    let n = |s: &Value, k: &str| s[k].as_u64().unwrap();
    let requests = n(&after, "inference_count") - n(&before, "inference_count");
    let batches = n(&after, "execution_count") - n(&before, "execution_count");
    assert_eq!(requests, 16);
    assert!(
        batches < requests,
        "{batches} batches for {requests} requests"
    );
    server.shutdown().await.unwrap();
}

/// A 0.2.0 plugin that describes itself needs no `config.pbtxt`: the server completes the
/// config from `describe`, as from an ONNX file. A plugin that does not describe itself gets a
/// load error saying what to declare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_describes_itself_needs_no_config() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    for (model, plugin) in [("add_sub_wasm", "add-sub"), ("undescribed", "legacy-v1")] {
        std::fs::create_dir_all(repo.join(model).join("1")).unwrap();
        std::fs::copy(
            wisp_tests::plugin_wasm(plugin),
            repo.join(model).join("1/model.wasm"),
        )
        .unwrap();
    }
    let server = start_plugins(repo).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let cfg = c.get("/v2/models/add_sub_wasm/config").await.unwrap();
    assert_eq!(cfg.status, 200, "{}", String::from_utf8_lossy(&cfg.body));
    let cfg = cfg.json();
    assert_eq!(cfg["backend"], "wasm");
    assert_eq!(cfg["max_batch_size"], 8);
    assert_eq!(cfg["input"][1]["name"], "INPUT1");
    assert_eq!(cfg["input"][1]["data_type"], "TYPE_FP32");
    assert_eq!(cfg["output"][0]["dims"], json!([16]));
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let r = c
        .post_json(
            "/v2/models/add_sub_wasm/infer",
            &json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": x},
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"][3], 4.0);
    let index = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    let undescribed = index
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "undescribed")
        .unwrap()
        .clone();
    assert_eq!(undescribed["state"], "UNAVAILABLE", "{undescribed}");
    let reason = undescribed["reason"].as_str().unwrap();
    assert!(reason.contains("does not describe itself"), "{reason}");
    server.shutdown().await.unwrap();
}

/// The batch-level BLS example: a plugin batch becomes one request to the model (inputs
/// concatenated, outputs split back), so the ONNX model runs far fewer executions than the
/// plugin receives requests, and each client gets its own rows back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_level_bls_plugin_makes_one_call_per_batch() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    copy_dir(
        &workspace_root().join("tests/fixtures/repo/add_sub"),
        &repo.join("add_sub"),
    )
    .unwrap();
    add_plugin_model(
        repo,
        "bls",
        1,
        "batch-bls",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{}"#,
            param("model", "add_sub")
        ),
    );
    let server = start_plugins(repo).await;
    let addr = server.http_addr();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await.unwrap();
                let a = vec![i as f32; 16];
                let r = c
                    .post_json(
                        "/v2/models/bls/infer",
                        &json!({"inputs": [
                            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a},
                            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]}]}),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let out = r.json()["outputs"].clone();
                let sum = out.as_array().unwrap().iter().find(|o| o["name"] == "OUTPUT0").unwrap();
                assert_eq!(sum["shape"], json!([1, 16]));
                assert_eq!(sum["data"][0], json!(i as f64 + 1.0), "its own rows");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut c = Client::connect(addr).await.unwrap();
    let stats = c
        .get("/v2/models/add_sub/versions/1/stats")
        .await
        .unwrap()
        .json()["model_stats"][0]
        .clone();
    let executions = stats["execution_count"].as_u64().unwrap();
    assert!(
        executions < 16,
        "{executions} executions for 16 requests: {stats}"
    );
    server.shutdown().await.unwrap();
}

/// What one load client saw: successes, and each failure's error text with when it came back.
type LoadOutcome = (u32, Vec<(Instant, String)>);

/// Sends requests to `model` from three clients until `stop` (bounded in count and time),
/// keeping each failure's error text and when it came back.
fn steady_load(
    addr: std::net::SocketAddr,
    model: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<LoadOutcome>> {
    (0..3)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await.unwrap();
                let (mut ok, mut failed) = (0u32, Vec::new());
                let started = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::SeqCst)
                    && ok < 100_000
                    && started.elapsed() < Duration::from_secs(60)
                {
                    let r = c
                        .post_json(&format!("/v2/models/{model}/infer"), &int_request([1, 2]))
                        .await
                        .unwrap();
                    if r.status == 200 {
                        ok += 1;
                    } else {
                        failed.push((Instant::now(), error_text(&r)));
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

async fn metric(addr: std::net::SocketAddr, line_start: &str) -> Option<f64> {
    let mut m = Client::connect(addr).await.unwrap();
    let text = String::from_utf8(m.get("/metrics").await.unwrap().body.to_vec()).unwrap();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sla_guarded_rollout_rolls_back_a_failing_version_and_keeps_a_healthy_one() {
    let dir = tempfile::tempdir().unwrap();
    let sla = |window: &str| {
        param("sla.max_error_rate", "0.05")
            + &param("sla.p99_latency_ms", "2000")
            + &param("sla.min_requests", "20")
            + &param("sla.window_secs", window)
    };
    add_plugin_model(
        dir.path(),
        "guarded",
        1,
        "testkit",
        &testkit_config(&sla("30")),
    );
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().to_path_buf();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["guarded".into()];
        s.no_wasm_cache = true;
        s.state_dir = Some(state_dir);
    })
    .await;
    let (addr, metrics) = (server.http_addr(), server.metrics_addr().unwrap());
    let remembered =
        || std::fs::read_to_string(state.path().join("rolled-back.json")).unwrap_or_default();
    let mut c = Client::connect(addr).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = steady_load(addr, "guarded", stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Version 2 fails every request (its config says so): it is swapped in, breaches the SLA
    // and version 1, still loaded, is swapped back.
    add_plugin_model(
        dir.path(),
        "guarded",
        2,
        "testkit",
        &testkit_config(&(sla("30") + &param("mode", "trap"))),
    );
    let swapped = Instant::now();
    let r = c
        .send("POST", "/v2/repository/models/guarded/load", &[], "{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut row = Value::Null;
    while swapped.elapsed() < Duration::from_secs(20) {
        row = wisp_tests::index_row(&mut c, "guarded", Some("2")).await;
        if row["state"] == "UNAVAILABLE" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rolled_back = Instant::now();
    let why = row["reason"].as_str().unwrap_or_default().to_string();
    assert!(why.starts_with("rolled back: the new version (2)"), "{row}");
    assert!(why.contains("error rate"), "{why}");
    let good = wisp_tests::index_row(&mut c, "guarded", Some("1")).await;
    assert_eq!(good["state"], "READY", "{good}");
    // Remembered in --state-dir, so a restart would not serve version 2 again.
    assert!(remembered().contains("\"guarded\""), "{}", remembered());
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A healthy version 3 is kept once its (one-second) window passes.
    add_plugin_model(
        dir.path(),
        "guarded",
        3,
        "testkit",
        &testkit_config(&sla("1")),
    );
    let r = c
        .send("POST", "/v2/repository/models/guarded/load", &[], "{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let kept = r#"wisp_model_rollout_kept_total{model="guarded"}"#;
    let started = Instant::now();
    while metric(metrics, kept).await != Some(1.0) && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(metric(metrics, kept).await, Some(1.0));
    let current = wisp_tests::index_row(&mut c, "guarded", Some("3")).await;
    assert_eq!(current["state"], "READY", "{current}");
    // New files: the record is forgotten.
    assert!(!remembered().contains("\"guarded\""), "{}", remembered());
    assert_eq!(
        current["reason"].as_str().unwrap_or_default(),
        "",
        "{current}"
    );
    assert_eq!(
        metric(metrics, r#"wisp_model_rollback_total{model="guarded"}"#).await,
        Some(1.0)
    );

    // Every failure was version 2's own, answered before the swap back was seen.
    let (mut ok, mut failures) = (0, Vec::new());
    for h in clients {
        let (n, f) = h.await.unwrap();
        ok += n;
        failures.extend(f);
    }
    assert!(ok > 0);
    assert!(!failures.is_empty(), "version 2 served nothing");
    for (at, text) in &failures {
        assert!(text.contains("panic") || text.contains("trap"), "{text}");
        // (a request already running on version 2 when it was swapped out may answer a
        // moment after the index showed the swap)
        let late = at.saturating_duration_since(rolled_back);
        assert!(
            late < Duration::from_millis(500),
            "a failure {late:?} after the rollback: {text}"
        );
    }
    server.shutdown().await.unwrap();
}

/// A short call to an idle plugin runs on the thread that received it; a call that then spins
/// until its deadline there must not take the server's async workers with it. Two instances
/// are made quick (identity calls), then both are sent a request that loops until its 1.5 s
/// deadline, one per async worker of this two-worker runtime: health checks every 50 ms still
/// answer within 500 ms, and both spins end with the deadline's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_spinning_on_the_callers_thread_does_not_stall_health_checks() {
    let dir = tempfile::tempdir().unwrap();
    add_plugin_model(
        dir.path(),
        "quick",
        1,
        "testkit",
        &testkit_config(
            &("instance_group [ { count: 2 } ]\n".to_string() + &param("wasm.timeout_ms", "1500")),
        ),
    );
    let server = start_plugins(dir.path()).await;
    let addr = server.http_addr();
    let mut c = Client::connect(addr).await.unwrap();
    for i in 0..20 {
        let r = c
            .post_json("/v2/models/quick/infer", &int_request([i, 2]))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", error_text(&r));
    }
    let spin = || {
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let mut body = int_request([1, 2]);
            body["parameters"] = json!({"mode": "loop"});
            c.post_json("/v2/models/quick/infer", &body).await.unwrap()
        })
    };
    let spins = [spin(), spin()];
    let mut health = Client::connect(addr).await.unwrap();
    let until = Instant::now() + Duration::from_millis(1200);
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), health.get("/v2/health/live"))
            .await
            .expect("a health check answered within 5 s")
            .unwrap();
        assert_eq!(r.status, 200);
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slowest < Duration::from_millis(500),
        "a health check took {slowest:?} while plugins spun"
    );
    for s in spins {
        let r = s.await.unwrap();
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            error_text(&r).contains("deadline of 1500 ms"),
            "{}",
            error_text(&r)
        );
    }
    server.shutdown().await.unwrap();
}
