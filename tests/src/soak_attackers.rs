//! The soak's attackers of issue 58, beside its good traffic: clients that stop reading their
//! streams (gRPC `ModelStreamInfer` and HTTP/1.1 `generate_stream` to the `vad_stream`
//! decoupled model), HTTP/2 connections that only send PINGs, and a second shared-memory token
//! that uses its own regions and tries to register the first client's key. Each attacker counts
//! how often the server cut it (and the shm one how often its attempt on the other token's key
//! was refused as a missing key, or, never, accepted).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use wisp_server::grpc::pb;
use wisp_tests::{f32_bytes, Client};

/// What the attackers saw.
#[derive(Default)]
pub(super) struct Tally {
    /// Non-reading gRPC stream connections the server closed.
    pub grpc_cut: AtomicU64,
    /// Non-reading HTTP/1.1 SSE connections the server closed.
    pub sse_cut: AtomicU64,
    /// PING-only HTTP/2 connections the server closed.
    pub ping_cut: AtomicU64,
    /// The second token's own shm requests: answered right, and not.
    pub shm_b_good: AtomicU64,
    pub shm_b_failed: AtomicU64,
    /// Its registrations of the first client's key: refused as missing (404), and accepted.
    pub shm_b_refused: AtomicU64,
    pub shm_b_breached: AtomicU64,
}

/// Seconds of 16 kHz audio in each attacker's request: 32 frames a second, each a response.
const AUDIO_SECS: usize = 4;

fn audio() -> Vec<f32> {
    (0..16_000 * AUDIO_SECS)
        .map(|i| ((i as f32) * 0.05).sin() * 0.3)
        .collect()
}

/// One round of an attacker: `true` when the server cut it.
type BoxedAttack = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// Starts the attackers; they stop when `stop` is set.
pub(super) fn spawn(
    http: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
    good_shm_key: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    // `n` clients each running `attack` again and again until `stop`, counting in `cut` the
    // times the server ended it.
    let mut repeat = |n: usize,
                      cut: fn(&Tally) -> &AtomicU64,
                      attack: fn(std::net::SocketAddr, Arc<AtomicBool>) -> BoxedAttack,
                      addr: std::net::SocketAddr| {
        for _ in 0..n {
            let (stop, tally) = (stop.clone(), tally.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if attack(addr, stop.clone()).await {
                        cut(&tally).fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    };
    repeat(
        2,
        |t| &t.grpc_cut,
        |a, s| Box::pin(async move { grpc_non_reader(a, &s).await }),
        grpc,
    );
    repeat(
        2,
        |t| &t.sse_cut,
        |a, s| Box::pin(async move { sse_non_reader(a, &s).await }),
        http,
    );
    repeat(
        3,
        |t| &t.ping_cut,
        |a, s| Box::pin(async move { ping_only(a, &s).await }),
        http,
    );
    {
        let (stop, tally) = (stop.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            shm_token_b(http, &good_shm_key, &stop, &tally).await;
        }));
    }
    tasks
}

/// Sleeps `d`, or less once `stop` is set.
async fn nap(stop: &AtomicBool, d: Duration) {
    let end = tokio::time::Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An HTTP/2 connection to `addr` and a task that PINGs it every second; resolves `true` when
/// the server closes it (`false` when `stop` came first or it could not connect).
async fn h2_pinging(
    addr: std::net::SocketAddr,
    stop: &AtomicBool,
    use_it: impl FnOnce(h2::client::SendRequest<Bytes>) -> Vec<Box<dyn std::any::Any + Send>>,
) -> bool {
    let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
        nap(stop, Duration::from_secs(1)).await;
        return false;
    };
    let Ok((client, mut conn)) = h2::client::handshake(tcp).await else {
        return false;
    };
    let Some(mut pings) = conn.ping_pong() else {
        return false;
    };
    let mut conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let _held = use_it(client);
    let pinger = tokio::spawn(async move {
        while pings.ping(h2::Ping::opaque()).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let closed = loop {
        if stop.load(Ordering::Relaxed) {
            break false;
        }
        match tokio::time::timeout(Duration::from_millis(200), &mut conn).await {
            Ok(_) => break true,
            Err(_) => continue,
        }
    };
    pinger.abort();
    conn.abort();
    closed
}

/// A `ModelStreamInfer` stream of four requests to `vad_stream`, never read.
async fn grpc_non_reader(addr: std::net::SocketAddr, stop: &AtomicBool) -> bool {
    let input = f32_bytes(&audio());
    h2_pinging(addr, stop, move |client| {
        let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
        let req = wisp_tests::grpc_request("ModelStreamInfer")
            .body(())
            .unwrap_or_default();
        let Ok((resp, mut tx)) = client.clone().send_request(req, false) else {
            return held;
        };
        let msg = pb::ModelInferRequest {
            model_name: "vad_stream".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "AUDIO".into(),
                datatype: "FP32".into(),
                shape: vec![(16_000 * AUDIO_SECS) as i64],
                ..Default::default()
            }],
            raw_input_contents: vec![input.into()],
            ..Default::default()
        };
        for _ in 0..4 {
            let _ = tx.send_data(wisp_tests::grpc_frame(&msg), false);
        }
        held.push(Box::new(tx));
        held.push(Box::new(resp));
        held.push(Box::new(client));
        held
    })
    .await
}

/// PINGs and nothing else.
async fn ping_only(addr: std::net::SocketAddr, stop: &AtomicBool) -> bool {
    h2_pinging(addr, stop, |client| vec![Box::new(client)]).await
}

/// An HTTP/1.1 `generate_stream` request to `vad_stream` on a socket with a 4 KiB receive
/// buffer, never read.
async fn sse_non_reader(addr: std::net::SocketAddr, stop: &AtomicBool) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::to_vec(&json!({ "AUDIO": audio() })).unwrap_or_default();
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    let _ = socket.set_recv_buffer_size(4096);
    let Ok(mut s) = socket.connect(addr).await else {
        nap(stop, Duration::from_secs(1)).await;
        return false;
    };
    let head = format!(
        "POST /v2/models/vad_stream/generate_stream HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
        return false;
    }
    // Not reading for 15 s (past the write timeout and the header timeout that follows a
    // finished response): then whatever the server sent is drained, and an end of stream within
    // a second says the server had given up on this client (its close waits behind the unread
    // bytes, so the client cannot see it earlier without reading).
    nap(stop, Duration::from_secs(15)).await;
    if stop.load(Ordering::Relaxed) {
        return false;
    }
    let mut buf = vec![0u8; 64 * 1024];
    let end = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// The second token: its own two regions under `wisp-shm-token: soak-b`, `add_sub` through
/// them, and on every round an attempt to register the good client's input key, which must be
/// refused as a missing key is.
async fn shm_token_b(addr: std::net::SocketAddr, good_key: &str, stop: &AtomicBool, tally: &Tally) {
    let pid = std::process::id();
    let (input, output) = (
        format!("/wisp_soak_b_in_{pid}"),
        format!("/wisp_soak_b_out_{pid}"),
    );
    let mut data = f32_bytes(&[3.0; 16]);
    data.extend(f32_bytes(&[4.0; 16]));
    if std::fs::write(format!("/dev/shm{input}"), data).is_err()
        || std::fs::write(format!("/dev/shm{output}"), [0u8; 128]).is_err()
    {
        return;
    }
    let token = [("wisp-shm-token", "soak-b".to_string())];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = Client::connect(addr).await else {
            nap(stop, Duration::from_millis(200)).await;
            continue;
        };
        let mut ok = true;
        for (name, key) in [("b_in", &input), ("b_out", &output)] {
            let base = format!("/v2/systemsharedmemory/region/{name}");
            let _ = c
                .send("POST", &format!("{base}/unregister"), &token, "")
                .await;
            let body =
                serde_json::to_vec(&json!({"key": key, "byte_size": 128})).unwrap_or_default();
            ok &= c
                .send("POST", &format!("{base}/register"), &token, body)
                .await
                .is_ok_and(|r| r.status == 200);
        }
        // The good client's key, under this token: what a missing key answers.
        let body =
            serde_json::to_vec(&json!({"key": good_key, "byte_size": 128})).unwrap_or_default();
        match c
            .send(
                "POST",
                "/v2/systemsharedmemory/region/theirs/register",
                &token,
                body,
            )
            .await
        {
            Ok(r) if r.status == 404 => tally.shm_b_refused.fetch_add(1, Ordering::Relaxed),
            Ok(r) if r.status == 200 => {
                let _ = c
                    .send(
                        "POST",
                        "/v2/systemsharedmemory/region/theirs/unregister",
                        &token,
                        "",
                    )
                    .await;
                tally.shm_b_breached.fetch_add(1, Ordering::Relaxed)
            }
            _ => 0,
        };
        for _ in 0..50 {
            if !ok || stop.load(Ordering::Relaxed) {
                break;
            }
            let region = |name: &str, offset: usize| json!({"shared_memory_region": name, "shared_memory_byte_size": 64, "shared_memory_offset": offset});
            let body = json!({
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": region("b_in", 0)},
                    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "parameters": region("b_in", 64)},
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": region("b_out", 0)}],
            });
            let body = serde_json::to_vec(&body).unwrap_or_default();
            let r = c
                .send(
                    "POST",
                    "/v2/models/add_sub/infer",
                    &[
                        token[0].clone(),
                        ("content-type", "application/json".into()),
                    ],
                    body,
                )
                .await;
            let sum_right = r.as_ref().is_ok_and(|r| r.status == 200)
                && std::fs::read(format!("/dev/shm{output}")).is_ok_and(|b| {
                    b.len() >= 64 && wisp_tests::f32_values(&b[..64]) == vec![7.0; 16]
                });
            if sum_right {
                tally.shm_b_good.fetch_add(1, Ordering::Relaxed);
            } else {
                tally.shm_b_failed.fetch_add(1, Ordering::Relaxed);
                ok = false;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = std::fs::remove_file(format!("/dev/shm{input}"));
    let _ = std::fs::remove_file(format!("/dev/shm{output}"));
}
