//! The grpc suite: HTTP (binary tensors) against gRPC on lean clients written on h2.

use super::*;

/// The grpc suite's load: `conc` lean clients (see [`lean`]) of `m` over gRPC
/// (`raw_input_contents`) at `grpc`, or over HTTP with binary tensors at `http`, each on its own
/// connection, sending back to back: a quarter of `secs` to warm up, then up to `secs` (and
/// `cap` requests in all) measured.
pub(super) async fn lean_load(
    target: Protocol,
    m: &Model,
    conc: usize,
    secs: f64,
    cap: usize,
) -> anyhow::Result<Stats> {
    use wisp_server::grpc::pb;
    let grpc_body = {
        let req = pb::ModelInferRequest {
            model_name: m.name.into(),
            inputs: m
                .input
                .iter()
                .map(|(n, dt, s, _)| pb::model_infer_request::InferInputTensor {
                    name: n.to_string(),
                    datatype: dt.to_string(),
                    shape: s.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: m
                .input
                .iter()
                .map(|(_, _, _, d)| bytes::Bytes::from(d.clone()))
                .collect(),
            ..Default::default()
        };
        wisp_tests::grpc_frame(&req)
    };
    let (http_body, n) = binary_request(&m.input, true);
    let http_body = bytes::Bytes::from(http_body);
    let headers = Arc::new(vec![("inference-header-content-length", n.to_string())]);
    let path = Arc::new(format!("/v2/models/{}/infer", m.name));
    let per_task_cap = cap.div_ceil(conc);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let (grpc_body, http_body, headers, path) = (
            grpc_body.clone(),
            http_body.clone(),
            headers.clone(),
            path.clone(),
        );
        // (the connection is polled in this task, so it wakes this task while it runs:
        // `Coalesce` keeps that wake from becoming a yield, as the server's connections do)
        tasks.push(tokio::spawn(wisp_server::coalesce::Coalesce::new(
            async move {
                enum C {
                    Http(lean::Http),
                    Grpc(lean::Grpc),
                }
                let mut c = match target {
                    Protocol::Http(a) => C::Http(lean::Http::connect(a).await?),
                    Protocol::Grpc(a) => C::Grpc(lean::Grpc::connect(a).await?),
                };
                let mut one = async || match &mut c {
                    C::Http(c) => c.post(&path, &headers, http_body.clone()).await,
                    C::Grpc(c) => c.unary("ModelInfer", grpc_body.clone()).await,
                };
                let (warm, mut warmed) = (Instant::now(), 0);
                while warm.elapsed().as_secs_f64() < secs / 4.0 {
                    one().await?;
                    warmed += 1;
                }
                let mut lat = Vec::new();
                let start = Instant::now();
                while start.elapsed().as_secs_f64() < secs && lat.len() < per_task_cap {
                    let t = Instant::now();
                    let r = one().await?;
                    lat.push(t.elapsed());
                    anyhow::ensure!(!r.is_empty(), "an empty response");
                }
                Ok::<_, anyhow::Error>((lat, start.elapsed(), warmed))
            },
        )));
    }
    gather(tasks).await
}

/// Where [`lean_load`] sends its requests.
#[derive(Clone, Copy)]
pub(super) enum Protocol {
    Http(std::net::SocketAddr),
    Grpc(std::net::SocketAddr),
}

/// The grpc suite's clients: each drives its own connection in the calling task (no connection
/// task to hand requests to, no task spawned per request), as a lean client in another process
/// would, so that the suite compares what the two protocols cost the server rather than what
/// hyper's clients cost (its HTTP/2 client spawns a task for every request body).
pub(super) mod lean {
    use std::net::SocketAddr;
    use std::pin::Pin;

    use anyhow::{anyhow, Context};
    use bytes::{Bytes, BytesMut};
    use http_body_util::{BodyExt, Full};
    use hyper::http;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpStream;

    async fn tcp(addr: SocketAddr) -> anyhow::Result<TcpStream> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        tcp.set_nodelay(true)?;
        Ok(tcp)
    }

    /// HTTP/1.1 keep-alive on hyper's client connection, polled beside each request.
    pub struct Http {
        send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        conn: Pin<Box<hyper::client::conn::http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>>,
    }

    impl Http {
        pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
            let (send, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp(addr).await?)).await?;
            Ok(Http {
                send,
                conn: Box::pin(conn),
            })
        }

        /// `POST path` with `body`; the response body, required to be a 200's.
        pub async fn post(
            &mut self,
            path: &str,
            headers: &[(&str, String)],
            body: Bytes,
        ) -> anyhow::Result<Bytes> {
            let Http { send, conn } = self;
            let mut req = http::Request::post(path).header("host", "127.0.0.1");
            for (k, v) in headers {
                req = req.header(*k, v);
            }
            let req = req.body(Full::new(body))?;
            let call = async {
                std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
                let resp = send.send_request(req).await?;
                let status = resp.status();
                let body = resp.into_body().collect().await?.to_bytes();
                anyhow::ensure!(
                    status == 200,
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&body)
                );
                Ok(body)
            };
            beside(call, conn.as_mut()).await
        }
    }

    /// gRPC unary calls on `h2`'s client connection, polled beside each call. Each call's
    /// HEADERS and DATA frames go out in one write.
    pub struct Grpc {
        send: h2::client::SendRequest<Bytes>,
        conn: Pin<Box<h2::client::Connection<TcpStream, Bytes>>>,
    }

    impl Grpc {
        pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
            let (send, conn) = h2::client::handshake(tcp(addr).await?).await?;
            Ok(Grpc {
                send,
                conn: Box::pin(conn),
            })
        }

        /// Calls `/inference.GRPCInferenceService/<method>` with `framed` (a length-prefixed
        /// message); the response message's bytes, required to come with status OK.
        pub async fn unary(&mut self, method: &str, framed: Bytes) -> anyhow::Result<Bytes> {
            let Grpc { send, conn } = self;
            let req = wisp_tests::grpc_request(method).body(())?;
            let call = async {
                std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
                let (resp, mut stream) = send.send_request(req, false)?;
                stream.send_data(framed, true)?;
                let (parts, mut body) = resp.await?.into_parts();
                let mut msg = BytesMut::new();
                while let Some(chunk) = body.data().await {
                    let chunk = chunk?;
                    body.flow_control().release_capacity(chunk.len())?;
                    msg.extend_from_slice(&chunk);
                }
                let trailers = body.trailers().await?.unwrap_or_default();
                let status = trailers
                    .get("grpc-status")
                    .or_else(|| parts.headers.get("grpc-status"));
                anyhow::ensure!(
                    parts.status == 200 && status.is_some_and(|s| s == "0"),
                    "gRPC call failed: HTTP {}, grpc-status {status:?}, grpc-message {:?}",
                    parts.status,
                    trailers.get("grpc-message")
                );
                anyhow::ensure!(msg.len() >= 5, "short gRPC response");
                Ok(msg.freeze().slice(5..))
            };
            beside(call, conn.as_mut()).await
        }
    }

    /// Runs `call` while polling its connection `conn` in the same task; a connection that
    /// ends first is an error.
    async fn beside<T, E: std::fmt::Debug>(
        call: impl std::future::Future<Output = anyhow::Result<T>>,
        conn: Pin<&mut impl std::future::Future<Output = Result<(), E>>>,
    ) -> anyhow::Result<T> {
        tokio::select! {
            biased;
            r = call => r,
            r = conn => Err(anyhow!("connection ended: {r:?}")),
        }
    }
}

pub(super) fn grpc_suite(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    engine: OnnxEngine,
) -> anyhow::Result<()> {
    let known = models();
    if let Some(unknown) = args
        .models
        .iter()
        .find(|n| !known.iter().any(|m| m.name == n.as_str()))
    {
        let names: Vec<&str> = known.iter().map(|m| m.name).collect();
        anyhow::bail!(
            "--models: no model named {unknown:?} in the grpc suite (it has: {})",
            names.join(", ")
        );
    }
    let rounds = args.rounds.max(1);
    println!(
        "## grpc: HTTP (binary tensors) vs gRPC (raw contents), same server, lean clients; \
         medians of {rounds} alternating round(s)\n"
    );
    println!("| model | concurrency | HTTP req/s | p50 µs | p99 µs | server CPU µs/req | client CPU µs/req | gRPC req/s | p50 µs | p99 µs | server CPU µs/req | client CPU µs/req | gRPC/HTTP throughput (range) | HTTP/gRPC server CPU (range) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // Server and client CPU per request (every request sent, warm-up included), with
    // --client-thread.
    let per_req = |cpu: Option<Cpu>, s: &Stats| {
        let n = s.sent.max(1) as f64;
        cpu.map_or((f64::NAN, f64::NAN), |c| {
            (us(c.server) / n, us(c.client) / n)
        })
    };
    let wanted = |m: &Model| args.models.is_empty() || args.models.iter().any(|n| n == m.name);
    for m in known.into_iter().filter(wanted) {
        let server = start_server(rt, &m.repo, engine)?;
        let grpc = server.grpc_addr().expect("gRPC is on");
        for &c in &args.batching_concurrency {
            // One row per round: HTTP then gRPC, so that drifts in the machine hit both.
            let mut runs = Vec::new();
            for _ in 0..rounds {
                let start = clock_now(libc::CLOCK_MONOTONIC);
                let (h, h_cpu) = args.load_cpu(
                    rt,
                    lean_load(
                        Protocol::Http(server.http_addr()),
                        &m,
                        c,
                        args.seconds,
                        args.max_requests,
                    ),
                );
                let h = h?;
                args.phase("http", &m, c, start, &h);
                let start = clock_now(libc::CLOCK_MONOTONIC);
                let (g, g_cpu) = args.load_cpu(
                    rt,
                    lean_load(Protocol::Grpc(grpc), &m, c, args.seconds, args.max_requests),
                );
                let g = g?;
                args.phase("grpc", &m, c, start, &g);
                let (h_cpu, g_cpu) = (per_req(h_cpu, &h), per_req(g_cpu, &g));
                runs.push([
                    h.rps,
                    us(h.p50),
                    us(h.p99),
                    h_cpu.0,
                    h_cpu.1,
                    g.rps,
                    us(g.p50),
                    us(g.p99),
                    g_cpu.0,
                    g_cpu.1,
                    g.rps / h.rps,
                    h_cpu.0 / g_cpu.0,
                ]);
            }
            let col = |i: usize| {
                let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
                v.sort_by(f64::total_cmp);
                v
            };
            let median = |i: usize| col(i)[runs.len() / 2];
            let cpu = |i: usize| {
                let v = median(i);
                if v.is_nan() {
                    "—".to_string()
                } else {
                    format!("{v:.1}")
                }
            };
            let ratio = |i: usize| {
                let v = col(i);
                match (v.first(), v.last()) {
                    (Some(lo), Some(hi)) if !lo.is_nan() && !hi.is_nan() => {
                        format!("{:.2} ({lo:.2}–{hi:.2})", v[v.len() / 2])
                    }
                    _ => "—".to_string(),
                }
            };
            println!(
                "| {} | {c} | {:.0} | {:.0} | {:.0} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
                m.name,
                median(0),
                median(1),
                median(2),
                cpu(3),
                cpu(4),
                median(5),
                median(6),
                median(7),
                cpu(8),
                cpu(9),
                ratio(10),
                ratio(11),
            );
        }
        rt.block_on(server.shutdown())?;
    }
    println!();
    println!(
        "(each figure is the median over the rounds, the ratios' ranges are their lowest and \
         highest round; server CPU: the process's CPU time less the client thread's, and \
         client CPU: the client thread's, each over the whole load, warm-up included, per \
         request sent, only with --client-thread)\n"
    );
    Ok(())
}
