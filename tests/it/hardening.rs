//! Hostile clients and hostile configs: network-supplied configs stay inside their model
//! directory and cannot widen a plugin's sandbox, config numbers are bounded, API groups can be
//! restricted (HTTP and gRPC), and slow, idle or excess connections are cut off. After every
//! case the server still serves a normal request.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wisp_server::grpc::pb;
use wisp_server::settings::{ControlMode, OnnxEngine};
use wisp_tests::{add_plugin_model, config_param, copy_dir, fixture_repo, Client, GrpcClient};

use crate::common::{connect_when_up, peak_rss_bytes, spawn_wisp, start_with};

fn add_sub_request() -> Value {
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![2.0f32; 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        ]
    })
}

async fn still_serves(c: &mut Client) {
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// A repository with add_sub, the classifier (labels beside its config), a plugin granted one
/// directory and one variable, and a secret file beside the repository.
fn hostile_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    for m in ["add_sub", "classifier"] {
        copy_dir(&fixture_repo().join(m), &repo.join(m)).unwrap();
    }
    add_plugin_model(
        &repo,
        "plugin",
        1,
        "testkit",
        &format!(
            r#"backend: "wasm"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
{}{}{}"#,
            config_param("wasm.allow_read_dir", "assets"),
            config_param("wasm.allow_env", "WISP_HARDENING_OK"),
            config_param("wasm.memory_limit_mb", "64"),
        ),
    );
    std::fs::create_dir_all(repo.join("plugin/assets")).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "top secret\n").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        dir.path().join("secret.txt"),
        repo.join("classifier/link.txt"),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_configs_cannot_escape_the_model_directory_or_widen_the_sandbox() {
    let dir = hostile_repo();
    let repo = dir.path().join("repo");
    let server = start_with(&repo, OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["*".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let secret = dir.path().join("secret.txt").display().to_string();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "classifier",
            json!({"output": [{"name": "probs", "label_filename": secret}]}),
            "label_filename",
        ),
        (
            "classifier",
            json!({"output": [{"name": "probs", "label_filename": "../../secret.txt"}]}),
            "label_filename",
        ),
        (
            "classifier",
            json!({"output": [{"name": "probs", "label_filename": "link.txt"}]}),
            "symbolic link",
        ),
        (
            "classifier",
            json!({"default_model_filename": "../../secret.txt"}),
            "default_model_filename",
        ),
        (
            "classifier",
            json!({"default_model_filename": secret}),
            "default_model_filename",
        ),
        (
            "add_sub",
            json!({"max_batch_size": 8, "model_warmup": [{"name": "w", "batch_size": 1,
            "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [16], "input_data_file": "../../../secret.txt"},
                       "INPUT1": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true}}}]}),
            "input_data_file",
        ),
        (
            "add_sub",
            json!({"max_batch_size": 8, "model_warmup": [{"name": "w", "batch_size": 1,
            "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [1099511627776i64], "zero_data": true},
                       "INPUT1": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true}}}]}),
            "dims",
        ),
        (
            "add_sub",
            json!({"max_batch_size": 8, "model_warmup": [{"name": "w", "batch_size": 1, "count": 4000000000u64,
            "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true},
                       "INPUT1": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": true}}}]}),
            "count",
        ),
        (
            "add_sub",
            json!({"max_batch_size": 8, "dynamic_batching": {"priority_levels": 1000000000000u64}}),
            "priority_levels",
        ),
        (
            "add_sub",
            json!({"max_batch_size": 2147483647}),
            "max_batch_size",
        ),
        (
            "add_sub",
            json!({"instance_group": [{"count": 100000}]}),
            "count",
        ),
        (
            "plugin",
            json!({"backend": "wasm", "max_batch_size": 4, "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "parameters": {"wasm.allow_read_dir": {"string_value": "/"}}}),
            "wasm.allow_read_dir",
        ),
        (
            "plugin",
            json!({"backend": "wasm", "max_batch_size": 4, "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "parameters": {"wasm.allow_read_dir": {"string_value": "."}, "wasm.memory_limit_mb": {"string_value": "64"}}}),
            "wasm.allow_read_dir",
        ),
        (
            "plugin",
            json!({"backend": "wasm", "max_batch_size": 4, "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "parameters": {"wasm.allow_env": {"string_value": "HOME,PATH"}, "wasm.memory_limit_mb": {"string_value": "64"}}}),
            "wasm.allow_env",
        ),
        (
            "plugin",
            json!({"backend": "wasm", "max_batch_size": 4, "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}]}),
            "wasm.memory_limit_mb",
        ),
    ];
    for (model, config, needle) in &cases {
        let body = json!({"parameters": {"config": config.to_string()}});
        let r = c
            .post_json(&format!("/v2/repository/models/{model}/load"), &body)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert_eq!(r.status, 400, "{model} {config}: {text}");
        assert!(
            text.contains(needle),
            "{model} {config}: '{text}' lacks '{needle}'"
        );
        assert!(!text.contains("top secret"), "{text}");
        // the client's own path may be echoed; the server's repository path never is
        assert!(
            !text.contains(&repo.display().to_string()),
            "a host path leaked: {text}"
        );
        // the model that was serving still serves
        assert_eq!(
            c.get(&format!("/v2/models/{model}/ready"))
                .await
                .unwrap()
                .status,
            200,
            "{model} after {config}"
        );
        still_serves(&mut c).await;
    }
    // narrowing is allowed
    let narrower = json!({"backend": "wasm", "max_batch_size": 4,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [2]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [2]}],
        "parameters": {"wasm.memory_limit_mb": {"string_value": "32"}, "wasm.allow_env": {"string_value": "WISP_HARDENING_OK"}}});
    let r = c
        .post_json(
            "/v2/repository/models/plugin/load",
            &json!({"parameters": {"config": narrower.to_string()}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // the index names no host path
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap();
    assert!(!String::from_utf8_lossy(&idx.body).contains(&repo.display().to_string()));
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_config_that_escapes_is_unavailable_and_names_no_host_path() {
    let dir = hostile_repo();
    let repo = dir.path().join("repo");
    std::fs::write(
        repo.join("classifier/config.pbtxt"),
        r#"output [ { name: "probs" label_filename: "../../secret.txt" } ]"#,
    )
    .unwrap();
    let server = start_with(&repo, OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = c.get("/v2/models/classifier/ready").await.unwrap();
    assert_eq!(r.status, 400);
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&idx.body).to_string();
    assert!(text.contains("label_filename"), "{text}");
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// One request per API group, over HTTP: (group, method, path, body).
fn http_probes() -> Vec<(&'static str, &'static str, &'static str, String)> {
    vec![
        ("health", "GET", "/v2/health/live", String::new()),
        ("health", "GET", "/v2/models/add_sub/ready", String::new()),
        ("metadata", "GET", "/v2", String::new()),
        ("metadata", "GET", "/v2/models/add_sub", String::new()),
        (
            "inference",
            "POST",
            "/v2/models/add_sub/infer",
            add_sub_request().to_string(),
        ),
        (
            "model-config",
            "GET",
            "/v2/models/add_sub/config",
            String::new(),
        ),
        (
            "statistics",
            "GET",
            "/v2/models/add_sub/stats",
            String::new(),
        ),
        (
            "model-repository",
            "POST",
            "/v2/repository/index",
            "{}".into(),
        ),
        ("logging", "GET", "/v2/logging", String::new()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_api_groups_need_their_header_over_http_and_grpc() {
    let groups = [
        "health",
        "metadata",
        "inference",
        "model-config",
        "statistics",
        "model-repository",
        "logging",
    ];
    for group in groups {
        let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
            s.http_restricted_api = vec![format!("{group}:x-wisp-key=open-sesame")];
            s.grpc_restricted_protocol = vec![format!("{group}:x-wisp-key=open-sesame")];
        })
        .await;
        let mut c = Client::connect(server.http_addr()).await.unwrap();
        for (g, method, path, body) in http_probes() {
            let r = c.send(method, path, &[], body.clone()).await.unwrap();
            if g == group {
                assert_eq!(r.status, 403, "{group}: {path}");
                assert_eq!(
                    r.json()["error"],
                    "This API is restricted, expecting header 'x-wisp-key'",
                    "{path}"
                );
                let wrong = c
                    .send(method, path, &[("x-wisp-key", "nope".into())], body.clone())
                    .await
                    .unwrap();
                assert_eq!(wrong.status, 403, "{group}: {path} with a wrong value");
                let ok = c
                    .send(method, path, &[("x-wisp-key", "open-sesame".into())], body)
                    .await
                    .unwrap();
                assert_eq!(ok.status, 200, "{group}: {path} with the header");
            } else {
                assert_eq!(r.status, 200, "{group} restricted, {path} is not");
            }
        }
        let addr = server.grpc_addr().unwrap();
        let mut g = GrpcClient::connect(addr).await.unwrap();
        let calls = [
            ("health", "ServerLive"),
            ("metadata", "ServerMetadata"),
            ("model-config", "ModelConfig"),
            ("statistics", "ModelStatistics"),
            ("model-repository", "RepositoryIndex"),
            ("logging", "LogSettings"),
        ];
        for (cg, method) in calls {
            let refused = grpc_call(&mut g, method, &[]).await;
            let allowed = grpc_call(
                &mut g,
                method,
                &[("triton-grpc-protocol-x-wisp-key", "open-sesame")],
            )
            .await;
            if cg == group {
                let (code, msg) = refused.expect_err(method);
                assert_eq!(code, 14, "{method}: UNAVAILABLE");
                assert!(
                    msg.contains("This protocol is restricted, expecting header")
                        && msg.contains("triton-grpc-protocol-x-wisp-key"),
                    "{method}: {msg}"
                );
            } else {
                refused.unwrap_or_else(|e| panic!("{group} restricted, {method} is not: {e:?}"));
            }
            allowed.unwrap_or_else(|e| panic!("{method} with the header: {e:?}"));
        }
        server.shutdown().await.unwrap();
    }
}

/// A gRPC call whose request can be empty for the probe (model name add_sub where it matters).
async fn grpc_call(
    g: &mut GrpcClient,
    method: &str,
    headers: &[(&str, &str)],
) -> Result<(), (i32, String)> {
    macro_rules! call {
        ($req:expr, $resp:ty) => {
            g.unary_with::<_, $resp>(method, &$req, headers)
                .await
                .unwrap()
                .map(|_| ())
        };
    }
    match method {
        "ServerLive" => call!(pb::ServerLiveRequest {}, pb::ServerLiveResponse),
        "ServerMetadata" => call!(pb::ServerMetadataRequest {}, pb::ServerMetadataResponse),
        "ModelConfig" => call!(
            pb::ModelConfigRequest {
                name: "add_sub".into(),
                version: String::new()
            },
            pb::ModelConfigResponse
        ),
        "ModelStatistics" => call!(
            pb::ModelStatisticsRequest {
                name: "add_sub".into(),
                version: String::new()
            },
            pb::ModelStatisticsResponse
        ),
        "RepositoryIndex" => call!(
            pb::RepositoryIndexRequest {
                repository_name: String::new(),
                ready: false
            },
            pb::RepositoryIndexResponse
        ),
        "LogSettings" => call!(
            pb::LogSettingsRequest {
                settings: Default::default()
            },
            pb::LogSettingsResponse
        ),
        other => panic!("no probe for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_413_405_and_grpc_resource_exhausted() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.http_max_input_size = 4096;
        s.grpc_max_message_size = 4096;
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = c
        .send("POST", "/v2/models/add_sub/infer", &[], vec![b' '; 5000])
        .await
        .unwrap();
    assert_eq!(r.status, 413);
    let r = c
        .send("DELETE", "/v2/models/add_sub", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "GET");
    let r = c
        .send("PUT", "/v2/models/add_sub/infer", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "POST");
    let mut g = GrpcClient::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    let big = pb::ModelInferRequest {
        model_name: "add_sub".into(),
        raw_input_contents: vec![vec![0u8; 8192].into()],
        ..Default::default()
    };
    let e = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &big)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.0, 8, "RESOURCE_EXHAUSTED, got {e:?}");
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// Reads until EOF or `limit`; true if the server closed the connection.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_idle_and_excess_connections_are_cut_off() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.http_header_timeout_secs = 1;
        s.http_body_timeout_secs = 1;
        s.idle_timeout_secs = 2;
        s.max_connections = Some(6);
    })
    .await;
    let addr = server.http_addr();
    // slow headers: a partial request line, then nothing
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut slow, Duration::from_secs(5)).await,
        "slow headers kept open"
    );
    // a body shorter than its Content-Length
    let mut short = tokio::net::TcpStream::connect(addr).await.unwrap();
    short
        .write_all(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\":")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), short.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.contains("--http-body-timeout-secs"), "{reply}");
    // an idle gRPC (HTTP/2) connection is closed after the idle timeout
    let mut idle = tokio::net::TcpStream::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(6)).await,
        "idle connection kept open"
    );
    // the connection cap: 6 held open without a request, the 7th takes the place of the one
    // held longest, which is closed at once; health still answers once they are cut
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let extra = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut held[0], Duration::from_millis(900)).await,
        "the 7th connection did not evict the one held longest"
    );
    drop(extra);
    // the held ones send nothing: the header timeout cuts them
    for h in held.iter_mut() {
        assert!(closed_within(h, Duration::from_secs(5)).await);
    }
    let mut c = Client::connect(addr).await.unwrap();
    assert_eq!(c.get("/v2/health/live").await.unwrap().status, 200);
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// Files that are not regular files in a repository — a FIFO as a model file, as a config and
/// as a plugin, a link to `/dev/zero` as a model file — neither hang nor spin the loader: each
/// model is UNAVAILABLE with a reason naming the kind of file, and the others serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_regular_files_are_read_from_a_repository() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    copy_dir(&fixture_repo().join("add_sub"), &repo.join("add_sub")).unwrap();
    let mkfifo = |path: &std::path::Path| {
        assert!(std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap()
            .success());
    };
    // a FIFO model file, a /dev/zero model file, a FIFO config
    for (name, kind) in [
        ("fifo_model", "fifo"),
        ("zero_model", "zero"),
        ("fifo_config", "config"),
    ] {
        let m = repo.join(name);
        copy_dir(&fixture_repo().join("add_sub"), &m).unwrap();
        let cfg = std::fs::read_to_string(m.join("config.pbtxt"))
            .unwrap()
            .replace("\"add_sub\"", &format!("\"{name}\""));
        std::fs::write(m.join("config.pbtxt"), cfg).unwrap();
        match kind {
            "fifo" => {
                std::fs::remove_file(m.join("1/model.onnx")).unwrap();
                mkfifo(&m.join("1/model.onnx"));
            }
            "zero" => {
                std::fs::remove_file(m.join("1/model.onnx")).unwrap();
                std::os::unix::fs::symlink("/dev/zero", m.join("1/model.onnx")).unwrap();
            }
            _ => {
                std::fs::remove_file(m.join("config.pbtxt")).unwrap();
                mkfifo(&m.join("config.pbtxt"));
            }
        }
    }
    // a plugin whose component is a FIFO
    add_plugin_model(
        repo,
        "fifo_plugin",
        1,
        "testkit",
        &crate::common::testkit_config(""),
    );
    std::fs::remove_file(repo.join("fifo_plugin/1/model.wasm")).unwrap();
    mkfifo(&repo.join("fifo_plugin/1/model.wasm"));
    let started = Instant::now();
    let server = tokio::time::timeout(
        Duration::from_secs(60),
        start_with(repo, OnnxEngine::Tract, |_| {}),
    )
    .await
    .expect("start-up does not hang on a FIFO");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    still_serves(&mut c).await;
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    for (name, kind) in [
        ("fifo_model", "a FIFO"),
        // (a link out of the model directory: refused as such before its kind matters)
        ("zero_model", "resolves outside the model directory"),
        ("fifo_config", "a FIFO"),
        ("fifo_plugin", "a FIFO"),
    ] {
        let row = idx
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {idx}"));
        assert_eq!(row["state"], "UNAVAILABLE", "{row}");
        let reason = row["reason"].as_str().unwrap();
        assert!(reason.contains(kind), "{name}: {reason}");
    }
    server.shutdown().await.unwrap();
}

/// A connection from `ip` (any loopback address) to `addr`.
async fn connect_from(ip: [u8; 4], addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((ip, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A health check on a new connection: its status and how long it took, or `None` when the
/// connection was refused or nothing came back within 5 s.
async fn health(addr: std::net::SocketAddr) -> Option<(u16, Duration)> {
    let start = Instant::now();
    let check = async {
        let mut c = Client::connect(addr).await.ok()?;
        c.get("/v2/health/live").await.ok()
    };
    let r = tokio::time::timeout(Duration::from_secs(5), check)
        .await
        .ok()??;
    Some((r.status, start.elapsed()))
}

/// The cap full of slow clients — bodies held half sent, heads trickled a line at a time
/// (each sending bytes often enough never to look idle) — costs nothing to a health check:
/// a new connection evicts the slowest. Held bodies are then cut by the minimum data rate,
/// with a 400 naming the flag. A per-address cap stops one address from taking the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_cannot_fill_the_connection_cap() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.max_connections = Some(10);
        s.max_connections_per_ip = Some(8);
        s.min_data_rate = 240;
    })
    .await;
    let addr = server.http_addr();
    let attacker = [127, 0, 0, 2];
    let mut bodies = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from(attacker, addr).await;
        s.write_all(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"inputs\":")
            .await
            .unwrap();
        bodies.push(s);
        // (distinct opening times, so that which is oldest is known)
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut heads = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from(attacker, addr).await;
        s.write_all(b"GET /v2/health/live HTTP/1.1\r\n")
            .await
            .unwrap();
        heads.push(s);
    }
    // The per-address cap: a ninth from the attacker's address takes the place of that
    // address's oldest unanswered connection (the first held body), never of someone else's.
    let ninth = connect_from(attacker, addr).await;
    assert!(
        closed_within(&mut bodies[0], Duration::from_millis(900)).await,
        "a ninth connection from one address did not evict that address's oldest"
    );
    drop(ninth);
    // Trickle the heads, a line every 300 ms, while health checks come and go.
    let trickle = tokio::spawn(async move {
        for i in 0..30 {
            for h in heads.iter_mut() {
                let _ = h.write_all(format!("x-slow-{i}: 1\r\n").as_bytes()).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        heads
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Two of ours fill the cap; every health check after that evicts a slow client.
    let mut ours = Client::connect(addr).await.unwrap();
    still_serves(&mut ours).await;
    let mut other = Client::connect(addr).await.unwrap();
    still_serves(&mut other).await;
    drop((ours, other));
    for _ in 0..5 {
        let (status, took) = health(addr).await.expect("a health check got in");
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(2), "health took {took:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every held body is gone by now or soon: evicted, or cut by the minimum rate after 5 s.
    for mut b in bodies {
        let mut reply = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(8), b.read_to_end(&mut reply)).await;
        assert!(read.is_ok(), "a held body was kept open");
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.is_empty() || reply.contains("--min-data-rate"),
            "{reply}"
        );
    }
    let mut c = Client::connect(addr).await.unwrap();
    still_serves(&mut c).await;
    trickle.abort();
    server.shutdown().await.unwrap();
}

/// A request body sent steadily but below the minimum rate is cut after the grace period; one
/// sent at a good pace over the same time is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_below_the_minimum_data_rate_is_cut_and_a_steady_one_is_served() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.min_data_rate = 1000;
    })
    .await;
    let addr = server.http_addr();
    let body = serde_json::to_vec(&add_sub_request()).unwrap();
    let send = |per_100ms: usize| {
        let body = body.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            for chunk in body.chunks(per_100ms) {
                if s.write_all(chunk).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut reply = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut reply)).await;
            String::from_utf8_lossy(&reply).to_string()
        }
    };
    // About 7 s at 300 bytes/s for a body of about 2 KB: below 1000 bytes/s past the grace.
    let slow = body.len() / 70;
    let reply = send(slow.max(1)).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert!(reply.contains("slower than 1000 bytes/s"), "{reply}");
    // The same body at 10 times that pace: served.
    let reply = send(slow * 10).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let mut c = Client::connect(addr).await.unwrap();
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// Sixteen gzip bodies of about 60 KB at once, each inflating to 60 MB (KServe and OpenAI
/// embeddings bodies alike): each is charged to the in-flight budget as it inflates, so the
/// burst stops at the budget with 503s, instead of inflating all sixteen (about +0.9 GB) and
/// refusing them afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bodies_are_charged_as_they_inflate() {
    let budget = 128u64 << 20;
    let child = spawn_wisp(
        &fixture_repo(),
        &["--max-inflight-bytes", &budget.to_string()],
        None,
    );
    let (pid, addr) = (child.pid(), child.http);
    let mut c = connect_when_up(addr).await;
    still_serves(&mut c).await;
    let before = peak_rss_bytes(pid);
    let mut json =
        String::from(r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":["#);
    while json.len() < 60 << 20 {
        json.push_str("1,");
    }
    json.push_str(r#"1]}]}"#);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, json.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    drop(json);
    let mut sends = Vec::new();
    for i in 0..16 {
        let gz = gz.clone();
        let path = if i % 2 == 0 {
            "/v2/models/add_sub/infer"
        } else {
            "/v1/embeddings"
        };
        sends.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await.unwrap();
            c.send("POST", path, &[("content-encoding", "gzip".into())], gz)
                .await
                .map(|r| r.status)
        }));
    }
    let mut refused = 0;
    for s in sends {
        let status = s.await.unwrap().unwrap();
        assert!(matches!(status, 400 | 413 | 503), "{status}");
        refused += usize::from(status == 503);
    }
    assert!(refused > 0, "no request met the budget");
    let grew = peak_rss_bytes(pid).saturating_sub(before);
    assert!(
        grew < 3 * budget + (64 << 20),
        "peak memory grew {} MB with a {} MB budget",
        grew >> 20,
        budget >> 20
    );
    still_serves(&mut c).await;
}

/// One 60 MB gRPC message of packed one-byte int64 varints decodes to 480 MB of `i64`s (and the
/// service would convert them into as much again). The codec walks the message and charges
/// what it will decode to before prost allocates anything: past a 128 MiB budget the call gets
/// RESOURCE_EXHAUSTED, over unary and stream alike, and memory never sees the vectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_typed_contents_are_charged_before_they_are_decoded() {
    let budget = 128u64 << 20;
    let child = spawn_wisp(
        &fixture_repo(),
        &["--max-inflight-bytes", &budget.to_string()],
        None,
    );
    let (pid, grpc) = (child.pid(), child.grpc);
    let mut c = connect_when_up(child.http).await;
    still_serves(&mut c).await;
    let before = peak_rss_bytes(pid);
    let n = 60usize << 20;
    let req = pb::ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT64".into(),
            shape: vec![1, n as i64],
            contents: Some(pb::InferTensorContents {
                int64_contents: vec![1; n],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut g = GrpcClient::connect(grpc).await.unwrap();
    let (code, msg) = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {msg}");
    assert!(msg.contains("max-inflight-bytes"), "{msg}");
    // The same message on a stream ends the stream with the same code.
    let framed = wisp_tests::grpc_frame(&req);
    drop(req);
    let stream = wisp_tests::grpc_request("ModelStreamInfer")
        .body(http_body_util::Full::new(framed))
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(grpc).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(stream).await.unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let status = body
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(status.as_deref(), Some("8"));
    let grew = peak_rss_bytes(pid).saturating_sub(before);
    assert!(
        grew < 3 * (n as u64) + (64 << 20),
        "peak memory grew {} MB for a {} MB message (its int64s alone are {} MB)",
        grew >> 20,
        n >> 20,
        (8 * n) >> 20
    );
    still_serves(&mut c).await;
}

/// A body that declares 60 MB and sends a few bytes: the room its declared length would take is
/// charged to the in-flight budget before it is reserved, so with a 16 MiB budget the request
/// is refused with a 503 as soon as its second frame arrives, not held until its body times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_is_charged_before_room_is_reserved_for_it() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.max_inflight_bytes = Some(16 << 20);
    })
    .await;
    let addr = server.http_addr();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n{\"inputs\":")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b" [").await.unwrap();
    let mut reply = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut reply))
        .await
        .expect("answered at once, not after the body timeout")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("--max-inflight-bytes"), "{reply}");
    let mut c = Client::connect(addr).await.unwrap();
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// The real `wisp` program in its own process, so its memory is its own: a 60 MB JSON array
/// (sent gzip'd, about 60 KB on the wire) once cost 1.3 GB of RSS before its 400 came back. Now
/// `data` goes straight from text to typed bytes and stops at the shape's count, so the peak
/// grows by a small multiple of the body at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compression_bomb_costs_memory_in_proportion_to_its_body() {
    let child = spawn_wisp(&fixture_repo(), &[], None);
    let (pid, addr) = (child.pid(), child.http);
    let mut c = connect_when_up(addr).await;
    still_serves(&mut c).await;
    let before = peak_rss_bytes(pid);
    let mut json =
        String::from(r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":["#);
    let body_len = 60 << 20;
    while json.len() < body_len {
        json.push_str("1,");
    }
    json.push_str(r#"1]},{"name":"INPUT1","datatype":"FP32","shape":[1,16],"data":[1]}]}"#);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, json.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    assert!(
        gz.len() < 1 << 20,
        "the bomb is small on the wire: {}",
        gz.len()
    );
    let r = c
        .send(
            "POST",
            "/v2/models/add_sub/infer",
            &[("content-encoding", "gzip".into())],
            gz,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("more elements than the shape"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let grew = peak_rss_bytes(pid).saturating_sub(before);
    eprintln!(
        "peak RSS grew by {} MB for a {} MB body",
        grew >> 20,
        json.len() >> 20
    );
    assert!(
        grew < 4 * json.len() as u64,
        "peak RSS grew by {grew} bytes for a {} byte body",
        json.len()
    );
    still_serves(&mut c).await;
    drop(child);
}

fn wisp_cli(args: &[&std::ffi::OsStr]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wisp-test-serve"))
        .args(args)
        .output()
        .expect("wisp runs");
    assert!(
        out.status.success(),
        "wisp {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_models_load_and_a_tampered_reload_keeps_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    for m in ["add_sub", "classifier"] {
        copy_dir(&fixture_repo().join(m), &repo.join(m)).unwrap();
    }
    copy_dir(&fixture_repo().join("classifier"), &repo.join("unsigned")).unwrap();
    let prefix = dir.path().join("release");
    wisp_cli(&["keygen".as_ref(), "--out".as_ref(), prefix.as_os_str()]);
    let key = prefix.with_extension("key");
    for m in ["add_sub", "classifier"] {
        let model_dir = repo.join(m);
        wisp_cli(&[
            "sign".as_ref(),
            "--model-dir".as_ref(),
            model_dir.as_os_str(),
            "--key".as_ref(),
            key.as_os_str(),
        ]);
    }
    let public = prefix.with_extension("pub");
    let server = start_with(&repo, OnnxEngine::Tract, |s| {
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["*".into()];
        s.model_verify_key = Some(public.clone());
        s.require_signed_models = true;
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(
        c.get("/v2/models/classifier/ready").await.unwrap().status,
        200
    );
    still_serves(&mut c).await;
    let r = c.get("/v2/models/unsigned/ready").await.unwrap();
    assert_eq!(r.status, 400);

    // tamper with the signed config, then ask for a reload
    let cfg = repo.join("add_sub/config.pbtxt");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}\n# tampered\n")).unwrap();
    let r = c
        .send("POST", "/v2/repository/models/add_sub/load", &[], "")
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, 400, "{body}");
    assert!(
        body.contains("integrity check failed") && body.contains("'config.pbtxt' does not match"),
        "{body}"
    );
    still_serves(&mut c).await;
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    let rows = idx.as_array().unwrap();
    let add_sub = rows.iter().find(|r| r["name"] == "add_sub").unwrap();
    assert_eq!(add_sub["state"], "READY");
    assert!(
        add_sub["reason"]
            .as_str()
            .unwrap()
            .contains("previous version still serving"),
        "{add_sub}"
    );
    let unsigned = rows.iter().find(|r| r["name"] == "unsigned").unwrap();
    assert!(
        unsigned.to_string().contains("--require-signed-models"),
        "{unsigned}"
    );
    // a load request may not swap in another config
    let r = c
        .post_json(
            "/v2/repository/models/classifier/load",
            &json!({"parameters": {"config": "{\"max_batch_size\": 2}"}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    // the failed checks are counted
    let m = reqwest_metrics(server.metrics_addr().unwrap()).await;
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("wisp_model_verify_failure_total{") && l.contains("model=\"add_sub\"")
        })
        .unwrap_or_else(|| panic!("no verify failure metric in\n{m}"));
    assert!(line.ends_with(" 1"), "{line}");
    // restoring the signed file makes the reload succeed
    std::fs::write(&cfg, text).unwrap();
    let r = c
        .send("POST", "/v2/repository/models/add_sub/load", &[], "")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    server.shutdown().await.unwrap();
}

async fn reqwest_metrics(addr: std::net::SocketAddr) -> String {
    let mut c = Client::connect(addr).await.unwrap();
    let r = c.get("/metrics").await.unwrap();
    String::from_utf8_lossy(&r.body).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_over_http_and_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let certs = wisp_tests::make_test_certs(dir.path()).unwrap();
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.http_use_ssl = true;
        s.http_server_cert = Some(certs.server_cert.clone());
        s.http_server_key = Some(certs.server_key.clone());
        s.grpc_use_ssl = true;
        s.grpc_use_ssl_mutual = true;
        s.grpc_server_cert = Some(certs.server_cert.clone());
        s.grpc_server_key = Some(certs.server_key.clone());
        s.grpc_root_cert = Some(certs.ca.clone());
    })
    .await;
    // HTTP over TLS, server authenticated only
    let tls = wisp_tests::tls_connect(server.http_addr(), &certs, false, &[b"http/1.1"])
        .await
        .unwrap();
    let mut c = Client::over(tls).await.unwrap();
    assert_eq!(c.get("/v2/health/live").await.unwrap().status, 200);
    still_serves(&mut c).await;
    // plain HTTP to a TLS port gets nowhere
    let mut plain = Client::connect(server.http_addr()).await.unwrap();
    assert!(plain.get("/v2/health/live").await.is_err());
    // gRPC with mutual TLS: with the client certificate it works
    let gaddr = server.grpc_addr().unwrap();
    let tls = wisp_tests::tls_connect(gaddr, &certs, true, &[b"h2"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut g = GrpcClient::over(tls).await.unwrap();
    let live: pb::ServerLiveResponse = g
        .unary("ServerLive", &pb::ServerLiveRequest {})
        .await
        .unwrap()
        .unwrap();
    assert!(live.live);
    // without one the handshake (or the first call) fails
    let refused = match wisp_tests::tls_connect(gaddr, &certs, false, &[b"h2"]).await {
        Err(_) => true,
        Ok(tls) => match GrpcClient::over(tls).await {
            Err(_) => true,
            Ok(mut g) => g
                .unary::<_, pb::ServerLiveResponse>("ServerLive", &pb::ServerLiveRequest {})
                .await
                .is_err(),
        },
    };
    assert!(
        refused,
        "mutual TLS accepted a client without a certificate"
    );
    server.shutdown().await.unwrap();
}

/// Settings are checked before any model loads, and every error is reported at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_setting_is_reported_before_models_load() {
    let mut s = wisp_server::settings::Settings::for_repository(fixture_repo());
    s.http_port = 0;
    s.grpc_port = 0;
    s.metrics_port = 0;
    s.http_restricted_api = vec!["nope:k=v".into()];
    s.cache_config = vec!["bogus".into()];
    s.http_use_ssl = true;
    s.require_signed_models = true;
    s.host_policy = vec!["x".into()];
    let e = match wisp_server::Server::start(s).await {
        Ok(_) => panic!("bad settings were accepted"),
        Err(e) => e.to_string(),
    };
    for needle in [
        "--http-restricted-api",
        "bogus",
        "--http-use-ssl needs --http-server-cert",
        "--require-signed-models needs --model-verify-key",
        "host",
    ] {
        assert!(e.contains(needle), "'{e}' lacks '{needle}'");
    }
}

/// Past `--max-inflight-bytes` a request is refused, not queued: HTTP 503, gRPC
/// RESOURCE_EXHAUSTED, with the flag named; smaller requests go on being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_budget_refuses_what_does_not_fit() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.max_inflight_bytes = Some(64 << 10);
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let big = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
        "data": vec![1.0f32; 16], "pad": "x".repeat(20 << 10)}]});
    let r = c.post_json("/v2/models/add_sub/infer", &big).await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("--max-inflight-bytes"));
    let mut g = GrpcClient::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    let req = pb::ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 32768],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0u8; 128 << 10].into()],
        ..Default::default()
    };
    let (code, msg) = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 8, "{msg}");
    assert!(msg.contains("--max-inflight-bytes"), "{msg}");
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// A `ModelStreamInfer` client that sends without reading its responses is slowed down by
/// flow control once its stream has `--grpc-stream-max-in-flight` requests in flight, instead
/// of having the server buffer without limit; what it sent is still all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_client_that_does_not_read_is_slowed_down() {
    use http_body_util::BodyExt;
    use prost::Message;
    // It pauses for 6 s: longer than the default write timeout, which would cut it.
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.stream_write_timeout_secs = 60;
    })
    .await;
    let (mut tx, body) =
        http_body_util::channel::Channel::<bytes::Bytes, std::convert::Infallible>::new(4);
    let response = raw_stream_infer(server.grpc_addr().unwrap(), body).await;
    let msg = wisp_tests::add_sub_grpc_request();
    let frame = wisp_tests::grpc_frame(&msg);
    let start = Instant::now();
    let mut sent = 0usize;
    let mut blocked = false;
    while start.elapsed() < Duration::from_secs(6) {
        match tokio::time::timeout(Duration::from_millis(1500), tx.send_data(frame.clone())).await {
            Ok(Ok(())) => sent += 1,
            Ok(Err(_)) => panic!("the stream was closed"),
            Err(_) => {
                blocked = true;
                break;
            }
        }
    }
    eprintln!("sent {sent} messages before the stream pushed back (blocked: {blocked})");
    assert!(
        blocked,
        "sent {sent} messages in 6 s without being slowed down"
    );
    // Reading the responses releases the stream: every message sent is answered.
    drop(tx);
    let resp = response.await.unwrap().unwrap();
    let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
        .await
        .expect("responses in time")
        .unwrap()
        .to_bytes();
    let mut answered = 0;
    let mut rest = &body[..];
    while rest.len() >= 5 {
        let n = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let r = pb::ModelStreamInferResponse::decode(&rest[5..5 + n]).unwrap();
        assert!(r.error_message.is_empty(), "{}", r.error_message);
        answered += 1;
        rest = &rest[5 + n..];
    }
    assert!(answered >= sent, "{answered} answers for {sent} messages");
    server.shutdown().await.unwrap();
}

/// A `ModelStreamInfer` message over `--grpc-max-message-size` ends the stream with
/// RESOURCE_EXHAUSTED, as a unary call's does, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_stream_message_is_resource_exhausted() {
    use http_body_util::BodyExt;
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.grpc_max_message_size = 4096;
    })
    .await;
    // A frame header claiming 8 KiB, then the 8 KiB.
    let mut frame = vec![0u8];
    frame.extend(8192u32.to_be_bytes());
    frame.extend(vec![0u8; 8192]);
    let body = http_body_util::Full::new(bytes::Bytes::from(frame));
    let resp = raw_stream_infer(server.grpc_addr().unwrap(), body)
        .await
        .await
        .unwrap()
        .unwrap();
    let collected = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .expect("the stream ends in time")
        .unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["grpc-status"], "8", "{trailers:?}");
    let message = trailers["grpc-message"].to_str().unwrap();
    assert!(message.contains("too%20large"), "{message}");
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    still_serves(&mut c).await;
    server.shutdown().await.unwrap();
}

/// Starts a `ModelStreamInfer` call on its own HTTP/2 connection, with `body` as the raw
/// request stream (gRPC frames), so that a test controls every byte and when it is sent.
async fn raw_stream_infer<B>(
    addr: std::net::SocketAddr,
    body: B,
) -> tokio::task::JoinHandle<hyper::Result<hyper::Response<hyper::body::Incoming>>>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = wisp_tests::grpc_request("ModelStreamInfer")
        .body(body)
        .unwrap();
    tokio::spawn(async move { sender.send_request(req).await })
}
