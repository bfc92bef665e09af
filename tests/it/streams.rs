//! Clients that stop reading their streams (Reliability III): whatever they do meanwhile
//! (PING frames included), they cost at most `--stream-write-timeout-secs`, after which their
//! connection is closed, their requests cancelled and the in-flight budget they held released.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use wisp_server::grpc::pb;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{add_plugin_model, copy_dir, fixture_repo, grpc_request, Client};

use crate::common::start_with;

/// INT32 elements in each request and in each of its responses (1 MiB).
const ELEMENTS: usize = 256 * 1024;

/// add_sub, and `big_stream`: the testkit plugin's decoupled `stream` mode over variable-size
/// tensors, so that each response is as large as its request.
fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_repo().join("add_sub"), &dir.path().join("add_sub")).unwrap();
    add_plugin_model(
        dir.path(),
        "big_stream",
        1,
        "testkit",
        r#"backend: "wasm"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "mode" value { string_value: "stream" } }
parameters { key: "wasm.timeout_ms" value { string_value: "60000" } }
"#,
    );
    dir
}

/// An HTTP/2 connection that never grants flow-control window (it reads nothing) and sends a
/// PING every 300 ms, as the attack did to look alive. `closed` resolves when the server ends
/// the connection.
struct NonReader {
    client: h2::client::SendRequest<Bytes>,
    /// Held so that the responses are never released (their window stays taken).
    responses: Vec<h2::client::ResponseFuture>,
    closed: tokio::task::JoinHandle<()>,
    pings: tokio::task::JoinHandle<u32>,
}

impl NonReader {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, mut conn) = h2::client::handshake(tcp).await.unwrap();
        let mut ping_pong = conn.ping_pong().expect("ping_pong");
        let closed = tokio::spawn(async move {
            let _ = conn.await;
        });
        let pings = tokio::spawn(async move {
            let mut n = 0;
            while ping_pong.ping(h2::Ping::opaque()).await.is_ok() && n < 200 {
                n += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            n
        });
        NonReader {
            client,
            responses: Vec::new(),
            closed,
            pings,
        }
    }

    /// Sends `req` with `body`, keeping the request stream open when `open`.
    async fn send(&mut self, req: hyper::Request<()>, body: Bytes, open: bool) {
        let mut client = self.client.clone().ready().await.unwrap();
        let (resp, mut tx) = client.send_request(req, false).unwrap();
        tx.send_data(body, !open).unwrap();
        if open {
            // the request stream stays open, as a streaming client's does
            std::mem::forget(tx);
        }
        self.responses.push(resp);
    }

    /// Whether the server closed the connection within `limit`.
    async fn closed_within(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, &mut self.closed).await.is_ok()
    }
}

fn stream_request(count: i64) -> pb::ModelInferRequest {
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "count".to_string(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(count)),
        },
    );
    pb::ModelInferRequest {
        model_name: "big_stream".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT".into(),
            datatype: "INT32".into(),
            shape: vec![ELEMENTS as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![1u8; ELEMENTS * 4].into()],
        parameters,
        ..Default::default()
    }
}

/// The head of a `generate_stream` call to `big_stream`.
fn generate_stream_head() -> hyper::Request<()> {
    hyper::Request::builder()
        .method("POST")
        .uri("http://127.0.0.1/v2/models/big_stream/generate_stream")
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

/// Whether the in-flight budget has room for `bytes` now: the probe is a JSON body of spaces
/// (a JSON body is charged five times its size) that add_sub cannot take, so a free budget
/// answers 400 after reading it and a spent one 503.
async fn budget_has_room(addr: std::net::SocketAddr, bytes: usize) -> bool {
    // Its own connection: a 503 answered before the body is read closes it (the client may
    // then fail to write the rest: that too is the budget refusing it; a 400 comes only after
    // the whole body was read).
    let mut c = Client::connect(addr).await.unwrap();
    let sent = c
        .send(
            "POST",
            "/v2/models/add_sub/infer",
            &[("content-type", "application/json".into())],
            vec![b' '; bytes / 5],
        )
        .await;
    let Ok(r) = sent else {
        return false;
    };
    assert!(
        r.status == 400 || r.status == 503,
        "{} {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    r.status == 400
}

/// Polls [`budget_has_room`] until it holds or `limit` passes.
async fn budget_frees_within(addr: std::net::SocketAddr, bytes: usize, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if budget_has_room(addr, bytes).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// A server on [`repo`] with an in-flight budget of `budget_mib` MiB and a 2 s write timeout,
/// checked to have its whole budget (but 1 MiB) free at first.
async fn server_with_budget(dir: &std::path::Path, budget_mib: u64) -> wisp_server::Server {
    let server = start_with(dir, OnnxEngine::Tract, |s| {
        s.max_inflight_bytes = Some(budget_mib << 20);
        s.stream_write_timeout_secs = 2;
    })
    .await;
    let room = ((budget_mib - 1) << 20) as usize;
    assert!(
        budget_has_room(server.http_addr(), room).await,
        "the budget is free at first"
    );
    server
}

/// What every non-reader test checks once its attack is sent: the attack holds most of the
/// budget, its connection is closed within 8 s however it PINGs, and then all of the budget
/// (but 1 MiB) is free again within 5 s.
async fn held_then_cut_and_freed(
    server: &wisp_server::Server,
    bad: &mut NonReader,
    budget_mib: u64,
) {
    let c = server.http_addr();
    let started = Instant::now();
    assert!(
        !budget_has_room(c, ((budget_mib - 2) << 20) as usize).await,
        "the attack did not take the budget: the test shows nothing"
    );
    assert!(
        bad.closed_within(Duration::from_secs(8)).await,
        "a client that reads nothing and sends PINGs kept its connection for 8 s"
    );
    eprintln!("closed {:?} after the check began", started.elapsed());
    assert!(
        budget_frees_within(c, ((budget_mib - 1) << 20) as usize, Duration::from_secs(5)).await,
        "the budget was still held 5 s after the non-reader was cut"
    );
}

/// The attack of issue 58: one `ModelStreamInfer` client sends large requests to a decoupled
/// model, never grants window and pings every 300 ms. It holds the budget only until the
/// write timeout: then its connection is closed and every other client has the budget again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_that_is_not_read_is_cut_and_frees_the_budget() {
    let dir = repo();
    let server = server_with_budget(dir.path(), 12).await;
    let mut bad = NonReader::connect(server.grpc_addr().unwrap()).await;
    let mut frames = Vec::new();
    for _ in 0..8 {
        frames.extend_from_slice(&wisp_tests::grpc_frame(&stream_request(1000)));
    }
    bad.send(
        grpc_request("ModelStreamInfer").body(()).unwrap(),
        frames.into(),
        true,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    held_then_cut_and_freed(&server, &mut bad, 12).await;
    assert!(bad.pings.await.unwrap() > 0);
    drop(bad.responses);
    server.shutdown().await.unwrap();
}

/// The same over HTTP/2 `generate_stream`: six unread SSE streams of 256 KiB events are cut
/// after the write timeout, whatever PINGs they send, and what they held is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_sse_streams_are_charged_then_cut() {
    let dir = repo();
    let server = server_with_budget(dir.path(), 24).await;
    let mut bad = NonReader::connect(server.http_addr()).await;
    // 64 Ki elements: a 128 KiB body (charged 16 times as a JSON tree), 256 KiB events.
    let body = serde_json::to_vec(&json!({"INPUT": vec![1; ELEMENTS / 4], "count": 1000})).unwrap();
    for _ in 0..6 {
        bad.send(generate_stream_head(), body.clone().into(), false)
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    held_then_cut_and_freed(&server, &mut bad, 24).await;
    drop(bad.responses);
    server.shutdown().await.unwrap();
}

/// One connection holds at most `--max-decoupled-per-connection` streaming requests, across
/// its streams; past it a request is refused at once (503), and other connections are not
/// affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_requests_per_connection_are_capped() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.max_decoupled_per_connection = 2;
        s.stream_write_timeout_secs = 30;
    })
    .await;
    // Events of a few hundred bytes: h2's client refuses a flood of tiny unread DATA frames.
    let body =
        Bytes::from(serde_json::to_vec(&json!({"INPUT": vec![1; 128], "count": 10_000})).unwrap());
    let start = |client: h2::client::SendRequest<Bytes>| {
        let body = body.clone();
        async move {
            let mut client = client.ready().await.unwrap();
            let (resp, mut tx) = client.send_request(generate_stream_head(), false).unwrap();
            tx.send_data(body, true).unwrap();
            resp.await.unwrap()
        }
    };
    let one = NonReader::connect(server.http_addr()).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = start(one.client.clone()).await;
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let refused = start(one.client.clone()).await;
    assert_eq!(refused.status(), 503);
    // Another connection has its own slots.
    let two = NonReader::connect(server.http_addr()).await;
    assert_eq!(start(two.client.clone()).await.status(), 200);
    drop(open);
    server.shutdown().await.unwrap();
}

/// At the connection cap, a connection with an open gRPC stream that rests is not taken for
/// an idle one: a new connection evicts a truly idle connection instead, and the stream goes
/// on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resting_stream_is_not_evicted_as_idle() {
    let dir = repo();
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.max_connections = Some(2);
    })
    .await;
    let addr = server.grpc_addr().unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2c, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut sender = h2c.ready().await.unwrap();
    let (resp, mut tx) = sender
        .send_request(grpc_request("ModelStreamInfer").body(()).unwrap(), false)
        .unwrap();
    let msg = wisp_tests::add_sub_grpc_request();
    let frame = wisp_tests::grpc_frame(&msg);
    tx.send_data(frame.clone(), false).unwrap();
    let mut body = resp.await.unwrap().into_body();
    let mut buf = Vec::new();
    let deadline = Duration::from_secs(20);
    let first: pb::ModelStreamInferResponse =
        tokio::time::timeout(deadline, wisp_tests::next_message(&mut body, &mut buf))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(first.error_message, "");
    // A second connection that never asks anything, then the stream rests past EVICT_AFTER.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A third connection at the cap of two: the idle one goes, not the stream's.
    let third = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(3), async {
        use tokio::io::AsyncReadExt;
        loop {
            match idle.read(&mut b).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(closed, "the idle connection was not the one evicted");
    tx.send_data(frame, false).unwrap();
    let second: pb::ModelStreamInferResponse =
        tokio::time::timeout(deadline, wisp_tests::next_message(&mut body, &mut buf))
            .await
            .expect("the resting stream was evicted")
            .unwrap();
    assert_eq!(second.error_message, "");
    tx.send_data(Bytes::new(), true).unwrap();
    drop((third, body));
    server.shutdown().await.unwrap();
}
