//! Live model management: control modes, the repository extension, hot reload without loss,
//! failed reloads, polling, memory over load/unload cycles, and the logging extension.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wisp_server::settings::{ControlMode, OnnxEngine};
use wisp_tests::{copy_dir, fixture_repo, workspace_root, Client};

use crate::common::{connect_when_up, rss_bytes, spawn_wisp, start_with};

fn add_sub_request() -> Value {
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![2.0f32; 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        ]
    })
}

fn fixture_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for m in ["add_sub", "classifier"] {
        copy_dir(&fixture_repo().join(m), &dir.path().join(m)).unwrap();
    }
    dir
}

async fn index(c: &mut Client) -> Vec<Value> {
    let r = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json().as_array().unwrap().clone()
}

fn row<'a>(idx: &'a [Value], name: &str) -> &'a Value {
    idx.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in index {idx:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_mode_loads_unloads_and_indexes() {
    let dir = fixture_copy();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["add_sub".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let idx = index(&mut c).await;
    assert_eq!(row(&idx, "add_sub")["state"], "READY");
    assert_eq!(row(&idx, "add_sub")["version"], "1");
    assert_eq!(row(&idx, "classifier")["state"], "UNAVAILABLE");
    assert_eq!(row(&idx, "classifier")["reason"], "unloaded");
    let ready = c
        .send("POST", "/v2/repository/index", &[], r#"{"ready": true}"#)
        .await
        .unwrap()
        .json();
    assert_eq!(ready.as_array().unwrap().len(), 1);

    assert_eq!(
        c.send("POST", "/v2/repository/models/classifier/load", &[], "")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        c.get("/v2/models/classifier/ready").await.unwrap().status,
        200
    );
    // load with a config override (Triton's JSON form)
    let cfg =
        json!({"max_batch_size": 2, "output": [{"name": "probs", "label_filename": "labels.txt"}]})
            .to_string();
    let body = json!({"parameters": {"config": cfg}});
    let r = c
        .post_json("/v2/repository/models/classifier/load", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        c.get("/v2/models/classifier/config").await.unwrap().json()["max_batch_size"],
        2
    );
    // unload
    let r = c
        .post_json(
            "/v2/repository/models/add_sub/unload",
            &json!({"parameters": {"unload_dependents": false}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        c.post_json("/v2/models/add_sub/infer", &add_sub_request())
            .await
            .unwrap()
            .status,
        404
    );
    assert_eq!(row(&index(&mut c).await, "add_sub")["reason"], "unloaded");
    // errors
    assert_eq!(
        c.send("POST", "/v2/repository/models/nope/load", &[], "")
            .await
            .unwrap()
            .status,
        404
    );
    let bad = c
        .post_json(
            "/v2/repository/models/classifier/load",
            &json!({"parameters": {"config": "{not json"}}),
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"].as_str().unwrap().contains("config"));
    assert_eq!(
        c.get("/v2/models/classifier/ready").await.unwrap().status,
        200,
        "a failed load keeps the model"
    );
    let r = c
        .send(
            "POST",
            "/v2/repository/other/models/classifier/load",
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(r.status, 501);
    server.shutdown().await.unwrap();

    // none mode refuses load/unload
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = c
        .send("POST", "/v2/repository/models/add_sub/unload", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.starts_with("explicit model load / unload is not allowed if polling is enabled"),
        "Triton's wording first: {msg}"
    );
    assert!(msg.contains("--model-control-mode explicit"), "{msg}");
    assert_eq!(c.get("/v2/models/add_sub/ready").await.unwrap().status, 200);
    server.shutdown().await.unwrap();
}

/// Explicit mode with no key and no `--allow-unauthenticated-control`: whoever reaches a port
/// may not load or unload (a load runs the repository's files and the request's overrides).
/// Putting `model-repository` behind a key opens that front end, to key holders only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_control_is_off_by_default_in_explicit_mode() {
    use wisp_server::grpc::pb;
    let dir = fixture_copy();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.load_model = vec!["add_sub".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for path in [
        "/v2/repository/models/classifier/load",
        "/v2/repository/models/add_sub/unload",
    ] {
        let r = c.send("POST", path, &[], "").await.unwrap();
        assert_eq!(r.status, 403, "{path}");
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(
            msg.contains("--allow-unauthenticated-control")
                && msg.contains("--http-restricted-api model-repository:"),
            "{msg}"
        );
    }
    let mut g = wisp_tests::GrpcClient::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    let (code, msg) = g
        .unary::<_, pb::RepositoryModelUnloadResponse>(
            "RepositoryModelUnload",
            &pb::RepositoryModelUnloadRequest {
                model_name: "add_sub".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 7, "PERMISSION_DENIED: {msg}");
    assert!(msg.contains("--grpc-restricted-protocol"), "{msg}");
    assert_eq!(c.get("/v2/models/add_sub/ready").await.unwrap().status, 200);
    // The index is only read, so it stays open.
    assert_eq!(row(&index(&mut c).await, "add_sub")["state"], "READY");
    server.shutdown().await.unwrap();

    // A key on HTTP's model-repository group opens HTTP control to its holders; gRPC stays shut.
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.http_restricted_api = vec!["model-repository:x-control=sesame".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let load = "/v2/repository/models/add_sub/load";
    assert_eq!(c.send("POST", load, &[], "").await.unwrap().status, 403);
    let keyed = c
        .send("POST", load, &[("x-control", "sesame".to_string())], "")
        .await
        .unwrap();
    assert_eq!(
        keyed.status,
        200,
        "{}",
        String::from_utf8_lossy(&keyed.body)
    );
    assert_eq!(c.get("/v2/models/add_sub/ready").await.unwrap().status, 200);
    let mut g = wisp_tests::GrpcClient::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    let (code, _) = g
        .unary::<_, pb::RepositoryModelLoadResponse>(
            "RepositoryModelLoad",
            &pb::RepositoryModelLoadRequest {
                model_name: "classifier".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 7);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_lose_no_request() {
    let dir = fixture_copy();
    let m = dir.path().join("add_sub");
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["*".into()];
    })
    .await;
    let addr = server.http_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            let mut versions = Vec::new();
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst)
                && versions.len() < 20_000
                && start.elapsed() < Duration::from_secs(60)
            {
                let r = c
                    .post_json("/v2/models/add_sub/infer", &add_sub_request())
                    .await
                    .unwrap();
                assert_eq!(
                    r.status,
                    200,
                    "request failed during reload: {}",
                    String::from_utf8_lossy(&r.body)
                );
                let body = r.json();
                assert_eq!(body["outputs"][0]["data"][0], 3.0);
                versions.push(
                    body["model_version"]
                        .as_str()
                        .unwrap()
                        .parse::<u64>()
                        .unwrap(),
                );
            }
            versions
        }));
    }
    let mut c = Client::connect(addr).await.unwrap();
    let cfg = std::fs::read_to_string(m.join("config.pbtxt")).unwrap();
    for v in 2..=5u64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        copy_dir(&m.join("1"), &m.join(v.to_string())).unwrap();
        // alternate config changes: batching on/off, instance count
        let extra = match v % 2 {
            0 => "dynamic_batching { max_queue_delay_microseconds: 100 }".to_string(),
            _ => String::new(),
        };
        let text = cfg.replace("count: 1", &format!("count: {}", 1 + v % 2));
        std::fs::write(m.join("config.pbtxt"), format!("{text}\n{extra}\n")).unwrap();
        let r = c
            .send("POST", "/v2/repository/models/add_sub/load", &[], "")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for t in clients {
        let versions = t.await.unwrap();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "answers went back to an older version"
        );
        assert_eq!(*versions.last().unwrap(), 5);
        total += versions.len();
    }
    assert!(total > 20, "only {total} requests were made");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_new_version_keeps_the_old_one_serving() {
    let dir = fixture_copy();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["*".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    std::fs::create_dir_all(dir.path().join("add_sub/2")).unwrap();
    std::fs::write(dir.path().join("add_sub/2/model.onnx"), b"broken").unwrap();
    let r = c
        .send("POST", "/v2/repository/models/add_sub/load", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("previous version still serving"));
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["model_version"], "1");
    let idx = index(&mut c).await;
    assert_eq!(row(&idx, "add_sub")["state"], "READY");
    assert!(row(&idx, "add_sub")["reason"]
        .as_str()
        .unwrap()
        .contains("reload failed"));
    server.shutdown().await.unwrap();
}

async fn wait_for(c: &mut Client, path: &str, body: &Value, want: impl Fn(&Value) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let r = c.post_json(path, body).await.unwrap();
        if r.status == 200 && want(&r.json()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_follows_the_repository_despite_a_broken_model() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_repo().join("add_sub"), &dir.path().join("add_sub")).unwrap();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Poll;
        s.repository_poll_secs = 1;
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    // a broken model appears, then a good one
    std::fs::create_dir_all(dir.path().join("broken/1")).unwrap();
    std::fs::write(
        dir.path().join("broken/config.pbtxt"),
        "this is not { valid",
    )
    .unwrap();
    copy_dir(
        &fixture_repo().join("classifier"),
        &dir.path().join("classifier"),
    )
    .unwrap();
    let x = json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": vec![0.5f32; 8]}]});
    assert!(
        wait_for(&mut c, "/v2/models/classifier/infer", &x, |_| true).await,
        "new model never loaded"
    );
    // a new version of add_sub is picked up too
    copy_dir(&dir.path().join("add_sub/1"), &dir.path().join("add_sub/2")).unwrap();
    assert!(
        wait_for(
            &mut c,
            "/v2/models/add_sub/infer",
            &add_sub_request(),
            |b| b["model_version"] == "2"
        )
        .await,
        "version 2 never served"
    );
    let idx = index(&mut c).await;
    assert_eq!(row(&idx, "broken")["state"], "UNAVAILABLE");
    assert!(row(&idx, "broken")["reason"]
        .as_str()
        .unwrap()
        .contains("config.pbtxt:1"));
    // and a removed model is unloaded
    std::fs::remove_dir_all(dir.path().join("classifier")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.get("/v2/models/classifier/ready").await.unwrap().status != 400 {
        assert!(Instant::now() < deadline, "removed model still loaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.shutdown().await.unwrap();
}

/// The real `wisp` program in its own process (so its memory is its own), cycled through
/// load/unload of the MobileNet-class demo model: a leak of even the 0.6 MB model file per
/// cycle is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_unload_cycles_return_memory() {
    let repo = workspace_root().join("model_repo");
    let child = spawn_wisp(
        &repo,
        &[
            "--model-control-mode",
            "explicit",
            "--allow-unauthenticated-control",
        ],
        None,
    );
    let (pid, addr) = (child.pid(), child.http);
    let mut c = connect_when_up(addr).await;
    async fn one(c: &mut Client) {
        assert_eq!(
            c.send("POST", "/v2/repository/models/ppocr_cls/load", &[], "")
                .await
                .unwrap()
                .status,
            200
        );
        assert_eq!(
            c.send("POST", "/v2/repository/models/ppocr_cls/unload", &[], "")
                .await
                .unwrap()
                .status,
            200
        );
    }
    // A leak raises the floor with every cycle; allocator caching (a new pool thread's arena, a
    // cached buffer) shows as spikes or a step or two, then levels off. So the floor — the
    // lowest RSS of each window of 10 cycles — must not climb by more than 3 MB in each of the
    // last three consecutive windows; a leak of the 0.6 MB model per cycle climbs 6 MB in
    // every window.
    let mut samples = Vec::new();
    for _ in 0..60 {
        one(&mut c).await;
        samples.push(rss_bytes(pid));
    }
    let floors: Vec<u64> = samples
        .chunks(10)
        .map(|w| *w.iter().min().unwrap())
        .collect();
    eprintln!("RSS floors per 10 cycles: {floors:?}");
    let climb = |a: u64, b: u64| b.saturating_sub(a) > 3 << 20;
    let climbing = floors[2..].windows(2).filter(|w| climb(w[0], w[1])).count();
    assert!(
        climbing < 3,
        "RSS keeps growing over load/unload cycles: floors {floors:?}, samples {samples:?}"
    );
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_settings_change_at_run_time() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let s = c.get("/v2/logging").await.unwrap().json();
    assert_eq!(s["log_verbose_level"], 0);
    assert_eq!(s["log_info"], true);
    let s = c
        .post_json(
            "/v2/logging",
            &json!({"log_verbose_level": 2, "log_info": false}),
        )
        .await
        .unwrap()
        .json();
    assert_eq!(s["log_verbose_level"], 2);
    assert_eq!(s["log_info"], false);
    assert_eq!(
        c.get("/v2/logging").await.unwrap().json()["log_verbose_level"],
        2
    );
    let r = c
        .post_json("/v2/logging", &json!({"log_verbose_level": "x"}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_only_the_instance_count_resizes_in_place() {
    let dir = fixture_copy();
    let m = dir.path().join("add_sub");
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["add_sub".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            c.post_json("/v2/models/add_sub/infer", &add_sub_request())
                .await
                .unwrap()
                .status,
            200
        );
    }
    let cfg = std::fs::read_to_string(m.join("config.pbtxt")).unwrap();
    let mut served = 3;
    for count in [3, 1] {
        std::fs::write(
            m.join("config.pbtxt"),
            cfg.replace("count: 1", &format!("count: {count}")),
        )
        .unwrap();
        let r = c
            .send("POST", "/v2/repository/models/add_sub/load", &[], "")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let conf = c.get("/v2/models/add_sub/config").await.unwrap().json();
        assert_eq!(conf["instance_group"][0]["count"], count);
        // same scheduler, so the statistics carry on (a reload would start them at zero)
        let s = c.get("/v2/models/add_sub/stats").await.unwrap().json();
        assert_eq!(
            s["model_stats"][0]["inference_count"], served,
            "the model was reloaded, not resized"
        );
        for _ in 0..4 {
            assert_eq!(
                c.post_json("/v2/models/add_sub/infer", &add_sub_request())
                    .await
                    .unwrap()
                    .status,
                200
            );
        }
        served += 4;
    }
    server.shutdown().await.unwrap();
}

/// An ensemble over `add_sub`'s inputs and outputs whose one step is `step`, as the JSON a load
/// request's `config` parameter carries.
fn ensemble_json(name: &str, step: &str) -> String {
    let tensor = |n: &str| json!({"name": n, "data_type": "TYPE_FP32", "dims": [16]});
    let map = |a: &str, b: &str| json!({a: a, b: b});
    json!({
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [tensor("INPUT0"), tensor("INPUT1")],
        "output": [tensor("OUTPUT0"), tensor("OUTPUT1")],
        "ensemble_scheduling": {"step": [{
            "model_name": step,
            "model_version": -1,
            "input_map": map("INPUT0", "INPUT1"),
            "output_map": map("OUTPUT0", "OUTPUT1"),
        }]},
    })
    .to_string()
}

/// Ensembles that would call themselves, directly or through another, are refused at load
/// with a 400 naming the path, through config overrides and through a later reload of a step;
/// the versions already serving keep serving, and the control plane and health stay live.
/// (Such a load used to be accepted: inferring hung, and a reload then wedged the server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_cycles_are_refused_at_load_and_nothing_wedges() {
    let dir = fixture_copy();
    for name in ["a", "b"] {
        std::fs::create_dir_all(dir.path().join(name).join("1")).unwrap();
        let text = r#"platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
"#;
        std::fs::write(dir.path().join(name).join("config.pbtxt"), text).unwrap();
    }
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["add_sub".into(), "a".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let load = |model: &str, step: &str| {
        let body = json!({"parameters": {"config": ensemble_json(model, step)}});
        (format!("/v2/repository/models/{model}/load"), body)
    };
    let served = |r: &wisp_tests::Reply| {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["outputs"][0]["data"][0], 3.0);
    };
    served(
        &c.post_json("/v2/models/a/infer", &add_sub_request())
            .await
            .unwrap(),
    );

    // A reload of `a` whose step is `a` itself.
    let (path, body) = load("a", "a");
    let r = c.post_json(&path, &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("circular dependency between ensembles: a -> a"),
        "{msg}"
    );

    // `b` over `a`, then a reload of `a` over `b`: a -> b -> a.
    let (path, body) = load("b", "a");
    let r = c.post_json(&path, &body).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    served(
        &c.post_json("/v2/models/b/infer", &add_sub_request())
            .await
            .unwrap(),
    );
    let (path, body) = load("a", "b");
    let r = c.post_json(&path, &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("circular dependency between ensembles: a -> b -> a"),
        "{msg}"
    );
    // The same cycle closed from the other side: `add_sub` reloaded as an ensemble over `b`.
    let (path, body) = load("add_sub", "b");
    let r = c.post_json(&path, &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(msg.contains("add_sub -> b -> a -> add_sub"), "{msg}");

    // Everything that served still serves; the control plane and health answer at once.
    for model in ["a", "b"] {
        served(
            &c.post_json(&format!("/v2/models/{model}/infer"), &add_sub_request())
                .await
                .unwrap(),
        );
    }
    let idx = index(&mut c).await;
    assert_eq!(row(&idx, "a")["state"], "READY");
    assert!(
        row(&idx, "a")["reason"]
            .as_str()
            .unwrap()
            .contains("circular dependency"),
        "{idx:?}"
    );
    let start = Instant::now();
    let r = c
        .post_json(
            "/v2/repository/models/b/unload",
            &json!({"parameters": {"unload_dependents": false}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = c
        .send("POST", "/v2/repository/models/b/load", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(c.get("/v2/health/live").await.unwrap().status, 200);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    server.shutdown().await.unwrap();
}

/// SIGTERM with a request that will not finish for a minute (a plugin spinning until its
/// deadline): the process exits within `--exit-timeout-secs`, not when the request ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_within_the_exit_timeout_whatever_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        crate::common::testkit_config(&wisp_tests::config_param("wasm.timeout_ms", "60000"));
    wisp_tests::add_plugin_model(dir.path(), "busy", 1, "testkit", &config);
    let mut wisp = spawn_wisp(dir.path(), &["--exit-timeout-secs", "2"], None);
    let mut c = connect_when_up(wisp.http).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.get("/v2/models/busy/ready").await.unwrap().status != 200 {
        assert!(Instant::now() < deadline, "busy did not load");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let http = wisp.http;
    let spinning = tokio::spawn(async move {
        let mut c = Client::connect(http).await.unwrap();
        let body = json!({
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}],
            "parameters": {"mode": "loop"},
        });
        let _ = c.post_json("/v2/models/busy/infer", &body).await;
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let pid = wisp.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exited = loop {
        if let Some(status) = wisp.child.0.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(20) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // (Killed when `wisp` drops, if it did not exit.)
    let status =
        exited.unwrap_or_else(|| panic!("still running {:?} after SIGTERM", start.elapsed()));
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "exited after {:?} with --exit-timeout-secs 2",
        start.elapsed()
    );
    spinning.abort();
}
