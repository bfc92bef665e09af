//! Reliability III: clients that share a host or guess a name cost only themselves. System
//! shared memory is off unless `--allow-client-shm`, and when on, a key is its registering
//! token's: another client cannot register it, read it or learn that it exists. A request is
//! charged what its decoded form holds, and refused before building what it may not have.

use wisp_server::settings::OnnxEngine;
use wisp_tests::{copy_dir, fixture_repo, Client, GrpcClient};

use crate::common::start_with;

/// A shm object under `/dev/shm`, removed on drop.
struct ShmObject(String);

impl ShmObject {
    fn new(tag: &str, bytes: &[u8]) -> Self {
        let key = format!("/wisp-it-{tag}-{}", std::process::id());
        std::fs::write(format!("/dev/shm{key}"), bytes).unwrap();
        ShmObject(key)
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm{}", self.0));
    }
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_repo().join("add_sub"), &dir.path().join("add_sub")).unwrap();
    dir
}

async fn register(c: &mut Client, name: &str, key: &str, token: Option<&str>) -> wisp_tests::Reply {
    let body = serde_json::json!({ "key": key, "offset": 0, "byte_size": 128 });
    let mut headers = vec![("content-type", "application/json".to_string())];
    if let Some(t) = token {
        headers.push(("wisp-shm-token", t.to_string()));
    }
    c.send(
        "POST",
        &format!("/v2/systemsharedmemory/region/{name}/register"),
        &headers,
        serde_json::to_vec(&body).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_shared_memory_is_off_by_default() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let obj = ShmObject::new("off", &[7u8; 128]);
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = register(&mut c, "r", &obj.0, None).await;
    assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body).contains("--allow-client-shm"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    server.shutdown().await.unwrap();
}

/// The attack of issue 58: a victim registers a key under its token; a client without the
/// token registers the same key under its own name. It must get what a missing key gets (404,
/// the same words), so it can neither read the victim's bytes nor learn that the key exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_belongs_to_the_token_that_registered_it() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.allow_client_shm = true;
    })
    .await;
    let secret = ShmObject::new("secret", &[42u8; 128]);
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let r = register(&mut c, "victim", &secret.0, Some("victim-token")).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let missing = format!("{}-missing", secret.0);
    for token in [None, Some("attacker-token")] {
        let taken = register(&mut c, "mine", &secret.0, token).await;
        let gone = register(&mut c, "mine", &missing, token).await;
        assert_eq!(
            taken.status,
            404,
            "{}",
            String::from_utf8_lossy(&taken.body)
        );
        assert_eq!(gone.status, taken.status);
        assert_eq!(
            String::from_utf8_lossy(&taken.body).replace(&secret.0, "KEY"),
            String::from_utf8_lossy(&gone.body).replace(&missing, "KEY"),
        );
    }
    // The victim's region is intact and still its own.
    let r = c
        .send(
            "GET",
            "/v2/systemsharedmemory/status",
            &[("wisp-shm-token", "victim-token".into())],
            Vec::new(),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&r.body).contains("victim"));
    server.shutdown().await.unwrap();
}

/// Refuse before you read: a load over a closed control plane is answered 403 from its head,
/// before its (here 50 MB, never sent) body is read or parsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_load_is_answered_before_its_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.model_control_mode = wisp_server::settings::ControlMode::Explicit;
        s.load_model = vec!["add_sub".into()];
    })
    .await;
    let mut tcp = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v2/repository/models/big/load HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n\
          {\"parameters\": {\"file:1/model.onnx\": \"AAAA",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("answered without the body")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("--allow-unauthenticated-control"), "{head}");
    server.shutdown().await.unwrap();
}

/// A request's parameters are bounded in number, over HTTP and gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_are_capped() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |_| {}).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let many: serde_json::Map<String, serde_json::Value> = (0..=wisp_core::infer::MAX_PARAMETERS)
        .map(|i| (format!("p{i}"), serde_json::Value::from(i)))
        .collect();
    let body = serde_json::json!({
        "parameters": many,
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
        ]
    });
    let r = c
        .post_json("/v2/models/add_sub/infer", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("parameters"));
    server.shutdown().await.unwrap();
}

/// Bodies whose decoded form is many times their bytes on the wire: a JSON shape of two million
/// dimensions and an unused key of a million empty lists (a `Value` tree of 32 bytes a value
/// for 2 or 3 bytes of text), a gRPC message of a million one-byte shape dimensions (eight
/// bytes each once decoded) or of a million empty inputs (hundreds of bytes each), and an
/// embeddings body of a million one-character texts. Each is refused (or skipped) before its
/// decoded form is built, with the field named, and the server's peak memory stays within its
/// 32 MiB budget plus a fixed overhead; before, the empty inputs alone took 300 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoded_forms_are_refused_or_charged_before_they_are_built() {
    use wisp_server::grpc::pb;
    let budget = 32u64 << 20;
    let child = crate::common::spawn_wisp(
        &fixture_repo(),
        &["--max-inflight-bytes", &budget.to_string()],
        None,
    );
    let (pid, grpc) = (child.pid(), child.grpc);
    let mut c = crate::common::connect_when_up(child.http).await;
    let good = wisp_tests::add_sub_json();
    let r = c
        .post_json("/v2/models/add_sub/infer", &good)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let before = crate::common::peak_rss_bytes(pid);
    let text = |r: &wisp_tests::Reply| String::from_utf8_lossy(&r.body).into_owned();

    // KServe JSON: a long shape, then a large unused key beside a good request.
    let dims = vec!["1"; 2 << 20].join(",");
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[{dims}],"data":[1]}}]}}"#
    );
    drop(dims);
    let r = c
        .send("POST", "/v2/models/add_sub/infer", &[], body.into_bytes())
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("shape"), "{}", text(&r));
    let mut body = serde_json::to_string(&good).unwrap();
    body.pop();
    body.push_str(r#","junk":["#);
    body.push_str(&vec!["[]"; 1 << 20].join(","));
    body.push_str("]}");
    let r = c
        .send("POST", "/v2/models/add_sub/infer", &[], body.into_bytes())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "an unused key is skipped: {}", text(&r));

    // gRPC: a million one-byte dimensions, then a million empty inputs.
    let mut g = GrpcClient::connect(grpc).await.unwrap();
    let mut req = wisp_tests::add_sub_grpc_request();
    req.inputs[0].shape = vec![1; 1 << 20];
    let (code, msg) = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 3, "INVALID_ARGUMENT: {msg}");
    assert!(msg.contains("dimensions"), "{msg}");
    let mut req = wisp_tests::add_sub_grpc_request();
    req.inputs = vec![Default::default(); 1 << 20];
    req.raw_input_contents.clear();
    let (code, msg) = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(code, 3, "INVALID_ARGUMENT: {msg}");
    assert!(msg.contains("inputs"), "{msg}");
    drop(req);

    // OpenAI embeddings: a million texts, past OpenAI's 2048, refused while parsing.
    let body = format!(
        r#"{{"model":"nope","input":[{}]}}"#,
        vec![r#""a""#; 1 << 20].join(",")
    );
    let r = c
        .send("POST", "/v1/embeddings", &[], body.into_bytes())
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("2048"), "{}", text(&r));

    let grew = crate::common::peak_rss_bytes(pid).saturating_sub(before);
    eprintln!("peak memory grew {} MB", grew >> 20);
    assert!(
        grew < budget + (48 << 20),
        "peak memory grew {} MB with a {} MB budget",
        grew >> 20,
        budget >> 20
    );
    let r = c
        .post_json("/v2/models/add_sub/infer", &good)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}
