//! Connection hygiene for every listener (HTTP, gRPC, metrics): a cap on open connections, a
//! header-read timeout, an idle timeout, and HTTP/2 limits. Slow, idle or abusive clients cost
//! a bounded amount and are cut off; each limit logs when it acts.
//!
//! - **Connection cap**: a listener's connections hold permits of a [`Gate`]. When a connection
//!   arrives and none is free, the connection idle longest (no request in flight, no bytes for
//!   at least [`EVICT_AFTER`]) is closed to make room, so a flood of idle connections cannot
//!   lock out a health check; if every connection is busy, the new one is closed at once (its
//!   file descriptor released immediately) rather than left to pile up until the process runs
//!   out of descriptors.
//! - **Header-read timeout** (HTTP/1): from the moment the server waits for a request head
//!   (which includes a keep-alive connection waiting for its next request) to the end of that
//!   head. A client that trickles headers, or holds a connection open without asking anything,
//!   is disconnected.
//! - **Idle timeout**: a connection with no bytes moving either way and no request in flight
//!   for this long is closed. It covers HTTP/2 and gRPC connections and stalled bodies.
//! - **HTTP/2**: hyper's reset-flood protection stays on; concurrent streams per connection and
//!   the header-list size are bounded.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The smallest HTTP/1 read buffer (hyper's default), which is also the cap on an HTTP/1
/// request head when `--max-header-size` is below it.
const HTTP1_MIN_BUF: usize = 400 * 1024;

/// The limits one listener applies.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// HTTP/1 header-read timeout (also bounds a keep-alive connection's wait between requests).
    pub header_timeout: Duration,
    /// Close a connection idle this long (no bytes either way, no request in flight).
    pub idle_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Largest request header block, in bytes: HTTP/2 header lists; HTTP/1 heads are capped at
    /// the larger of this and 400 KiB (hyper's read buffer).
    pub max_header_size: usize,
}

/// How long a connection must have been idle before a new one may evict it.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// How long a new connection waits for the permit of the connection it evicted.
const EVICT_WAIT: Duration = Duration::from_millis(200);

/// What the gate knows of one open connection.
#[derive(Debug, Default)]
struct ConnState {
    /// Requests of this connection whose handler is running.
    in_flight: AtomicUsize,
    /// When bytes last moved, in ms since the gate was made.
    last_active_ms: AtomicU64,
    /// Closes the connection at once.
    kill: tokio::sync::Notify,
}

/// A cap on open connections, shared by the listeners that use it.
#[derive(Debug)]
pub struct Gate {
    name: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    refused: AtomicU64,
    evicted: AtomicU64,
    epoch: std::time::Instant,
    next_id: AtomicU64,
    conns: std::sync::Mutex<std::collections::HashMap<u64, Arc<ConnState>>>,
}

impl Gate {
    /// A gate admitting at most `max` connections at once.
    pub fn new(name: &'static str, max: usize) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Gate {
            name,
            max,
            permits: Arc::new(Semaphore::new(max)),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            next_id: AtomicU64::new(0),
            conns: Default::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Closes the connection idle longest, if one has been idle for [`EVICT_AFTER`].
    fn evict_idlest(&self) -> bool {
        let now = self.now_ms();
        let min_idle = EVICT_AFTER.as_millis() as u64;
        let conns = self.conns.lock().expect("connections lock");
        let victim = conns
            .values()
            .filter(|c| c.in_flight.load(Ordering::Relaxed) == 0)
            .map(|c| (c.last_active_ms.load(Ordering::Relaxed), c))
            .filter(|(last, _)| now.saturating_sub(*last) >= min_idle)
            .min_by_key(|(last, _)| *last);
        match victim {
            Some((_, c)) => {
                c.kill.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Closes a connection the cap has no room for at once, releasing its file descriptor
    /// rather than letting refused connections pile up.
    fn refuse(&self, tcp: TcpStream, peer: SocketAddr) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                listener = self.name,
                %peer,
                max = self.max,
                refused = n,
                "connection refused: the connection limit is reached"
            );
        }
        drop(tcp);
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// The default connection cap: three quarters of the process's open-file limit (the rest is
/// left for model files, logs and the listeners themselves), at most 16384.
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024);
    (soft.saturating_sub(64) * 3 / 4).clamp(16, 16384)
}

/// Wraps a TCP stream: fails with `TimedOut` once no bytes have moved either way for
/// `idle` while the connection has no request in flight.
struct IdleIo {
    inner: TcpStream,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    state: Arc<ConnState>,
    gate: Arc<Gate>,
    peer: SocketAddr,
}

impl IdleIo {
    fn touch(&mut self) {
        let at = Instant::now() + self.idle;
        self.timer.as_mut().reset(at);
        self.state
            .last_active_ms
            .store(self.gate.now_ms(), Ordering::Relaxed);
    }

    /// A write's outcome: progress resets the idle clock; a stall checks it.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touch();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => match self.check(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            other => other,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.state.in_flight.load(Ordering::Relaxed) > 0 {
            self.touch();
            return Ok(());
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            tracing::info!(peer = %self.peer, secs = self.idle.as_secs(), "closing idle connection");
            return Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
        }
        Ok(())
    }
}

impl AsyncRead for IdleIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.check(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            other => other,
        }
    }
}

impl AsyncWrite for IdleIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.after_write(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(state: &Arc<ConnState>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `router` on `listener` under `limits` and `gate` until `shutdown` turns true, then
/// stops accepting, asks every open connection to finish (in-flight requests complete), and
/// returns when they have.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnLimits,
    gate: Arc<Gate>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // hyper caps an HTTP/1 head at its read buffer; the buffer also sizes body reads, so
        // it stays at least hyper's default (400 KiB) and large bodies are read in few chunks.
        .max_buf_size(limits.max_header_size.max(HTTP1_MIN_BUF));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_size).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopped(&mut shutdown) => break,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning on the error.
                tracing::warn!(listener = gate.name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let conn = Conn {
            builder: builder.clone(),
            router: router.clone(),
            limits: limits.clone(),
            gate: gate.clone(),
            tls: tls.clone(),
            stop: shutdown.clone(),
        };
        match gate.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(crate::coalesce::Coalesce::new(conn.run(tcp, peer, permit)));
            }
            Err(_) if gate.evict_idlest() => {
                let n = gate.evicted.load(Ordering::Relaxed);
                if n.is_power_of_two() {
                    tracing::warn!(listener = gate.name, %peer, evicted = n, "connection limit reached: closed the longest-idle connection");
                }
                // The evicted connection's task returns its permit as it ends; the wait is
                // this connection's, so the accept loop goes on at once.
                tokio::spawn(async move {
                    let wait = conn.gate.permits.clone().acquire_owned();
                    match tokio::time::timeout(EVICT_WAIT, wait).await {
                        Ok(Ok(permit)) => {
                            crate::coalesce::Coalesce::new(conn.run(tcp, peer, permit)).await
                        }
                        _ => conn.gate.refuse(tcp, peer),
                    }
                });
            }
            Err(_) => gate.refuse(tcp, peer),
        }
    }
    drop(listener);
    // Every connection holds a permit until it ends: wait for all of them to come back.
    let _all = gate.permits.acquire_many(gate.max as u32).await;
    Ok(())
}

/// What a new connection needs from its listener.
struct Conn {
    builder: Arc<auto::Builder<TokioExecutor>>,
    router: axum::Router,
    limits: ConnLimits,
    gate: Arc<Gate>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<bool>,
}

impl Conn {
    /// Serves `tcp` while holding `permit`, then gives the permit back.
    async fn run(self, tcp: TcpStream, peer: SocketAddr, permit: OwnedSemaphorePermit) {
        let Conn {
            builder,
            router,
            limits,
            gate,
            tls,
            stop,
        } = self;
        // Small responses and HTTP/2 frames must not wait for Nagle's algorithm (a 40 ms
        // stall with delayed ACKs).
        let _ = tcp.set_nodelay(true);
        let state = Arc::new(ConnState::default());
        state.last_active_ms.store(gate.now_ms(), Ordering::Relaxed);
        let id = gate.next_id.fetch_add(1, Ordering::Relaxed);
        gate.conns
            .lock()
            .expect("connections lock")
            .insert(id, state.clone());
        let io = IdleIo {
            inner: tcp,
            idle: limits.idle_timeout,
            timer: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            state: state.clone(),
            gate: gate.clone(),
            peer,
        };
        let conn_state = state.clone();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let guard = InFlight::new(&conn_state);
                let call = tower_call(router.clone(), req);
                async move {
                    let resp = call.await;
                    drop(guard);
                    resp
                }
            });
        match tls {
            None => run_conn(&builder, io, service, &state, stop, peer).await,
            Some(acceptor) => {
                // The handshake is bounded like a request head.
                match tokio::time::timeout(limits.header_timeout, acceptor.accept(io)).await {
                    Ok(Ok(tls_io)) => run_conn(&builder, tls_io, service, &state, stop, peer).await,
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            }
        }
        gate.conns.lock().expect("connections lock").remove(&id);
        drop(permit);
    }
}

/// Serves one connection until it ends, is evicted, or the server stops (gracefully).
async fn run_conn<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    state: &ConnState,
    mut stop: watch::Receiver<bool>,
    peer: SocketAddr,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = state.kill.notified() => {
            tracing::info!(%peer, "closing an idle connection to make room for a new one");
            Ok(())
        }
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Resolves once `rx` says stop (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Runs one request through the router.
fn tower_call(
    router: axum::Router,
    req: hyper::Request<hyper::body::Incoming>,
) -> impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> {
    use tower_service::Service;
    let mut router = router;
    router.call(req.map(axum::body::Body::new))
}
