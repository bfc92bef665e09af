//! Connection hygiene for every listener (HTTP, gRPC, metrics): a cap on open connections, a
//! header-read timeout, an idle timeout, and HTTP/2 limits. Slow, idle or abusive clients cost
//! a bounded amount and are cut off; each limit logs when it acts.
//!
//! - **Connection cap**: a listener's connections hold permits of a [`Gate`]. When a connection
//!   arrives and none is free, the worst connection is closed to make room
//!   (`Gate::evict_worst`): the one unanswered longest among those still sending a request or
//!   with none in flight, unless it has shown that it sends at least the minimum data rate.
//!   So a flood of idle or trickling connections cannot lock out a health check, while a
//!   connection waiting for its model is never cut. If no connection qualifies, the new one is
//!   closed at once (its file descriptor released immediately) rather than left to pile up
//!   until the process runs out of descriptors. With no minimum rate (`--min-data-rate 0`),
//!   only connections idle for [`EVICT_AFTER`] are closed for new ones.
//! - **Per-peer cap** (optional): at most so many connections from one IP address; a new one
//!   over it evicts that address's worst connection by the same rule, or is closed.
//! - **Minimum data rate**: after a grace period ([`RATE_GRACE`]), a request body (other than
//!   gRPC's, whose streams may rest between messages) must keep arriving at an average of at
//!   least the minimum rate, as Kestrel's `MinRequestBodyDataRate` and nginx's
//!   `client_body_timeout` ask; below it, the body fails and the request is answered.
//! - **TLS handshake timeout**: a handshake must finish within its own bound.
//! - **Header-read timeout** (HTTP/1): from the moment the server waits for a request head
//!   (which includes a keep-alive connection waiting for its next request) to the end of that
//!   head. A client that trickles headers, or holds a connection open without asking anything,
//!   is disconnected.
//! - **Idle timeout**: a connection with no request in flight and no body bytes moving either
//!   way for this long is closed. HTTP/2 control frames (PING, SETTINGS, WINDOW_UPDATE) are not
//!   activity, so a client cannot hold an idle connection with them. It covers HTTP/2 and gRPC
//!   connections and stalled bodies.
//! - **Stream write timeout**: a connection whose client has taken none of a response for this
//!   long (a socket write waiting, or a response chunk waiting for the client's HTTP/2
//!   flow-control window: see the `written` module) is closed, which cancels its requests and frees
//!   whatever they held. A client that stops reading a stream costs at most this long.
//!   Connections with an open response are never evicted for new ones: this timeout and the
//!   idle timeout are what end them.
//! - **HTTP/2**: hyper's reset-flood protection stays on; concurrent streams per connection and
//!   the header-list size are bounded.

mod pace;
mod written;

use pace::{IdleIo, InFlight, Paced};
use written::Written;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
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
    /// The slowest a request body may arrive after [`RATE_GRACE`], in bytes per second, and
    /// the rate below which a connection counts as slow for eviction (0: neither applies).
    pub min_data_rate: u64,
    /// The longest a TLS handshake may take.
    pub tls_handshake_timeout: Duration,
    /// The longest a client may leave a response (a stream's next message, an event, a body)
    /// untaken before its connection is closed and its requests cancelled.
    pub stream_write_timeout: Duration,
    /// Decoupled (streaming) requests one connection may have in flight, across its streams.
    pub max_decoupled_per_connection: usize,
}

/// The decoupled requests one connection may still start: every request of the connection
/// carries it (an extension), and a decoupled request holds a permit until it ends.
#[derive(Debug, Clone)]
pub struct DecoupledSlots(pub Arc<Semaphore>);

impl DecoupledSlots {
    /// A permit for one more decoupled request of this connection, or why not.
    pub fn take(&self) -> Result<OwnedSemaphorePermit, wisp_core::Error> {
        self.0.clone().try_acquire_owned().map_err(|_| {
            wisp_core::Error::exhausted(
                "this connection has as many streaming requests in flight as it may (--max-decoupled-per-connection): wait for one to end, or open another connection",
            )
        })
    }
}

/// How long a request body may arrive slower than the minimum data rate (Kestrel's default).
pub const RATE_GRACE: Duration = Duration::from_secs(5);

/// How long a connection must have been idle before a new one may evict it.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// How long a new connection waits for the permit of the connection it evicted.
const EVICT_WAIT: Duration = Duration::from_millis(200);

/// What the gate knows of one open connection.
#[derive(Debug)]
struct ConnState {
    /// The gate's epoch, which every `_ms` field counts from.
    epoch: std::time::Instant,
    /// The peer's address, for the per-peer cap.
    ip: IpAddr,
    /// When it was accepted, in ms since the gate was made.
    opened_ms: u64,
    /// Requests of this connection whose handler is running.
    in_flight: AtomicUsize,
    /// Requests of this connection whose body is still arriving.
    receiving: AtomicUsize,
    /// When a request last started, sent body bytes, or had body bytes sent to it, or one was
    /// in flight, in ms since the gate was made. Control frames (HTTP/2 PING, SETTINGS,
    /// WINDOW_UPDATE) do not count: a client cannot keep an idle connection with them.
    last_active_ms: AtomicU64,
    /// Response bodies not yet ended.
    bodies: AtomicUsize,
    /// Each open response body's stall clock (see the `written` module); dead ones are
    /// dropped as the clocks are read.
    handed: std::sync::Mutex<Vec<std::sync::Weak<AtomicU64>>>,
    /// Since when (ms + 1; 0: not) a write to the socket has been waiting for the client.
    write_blocked_ms: AtomicU64,
    /// When the server last wrote to it (answered), in ms since the gate was made.
    last_write_ms: AtomicU64,
    /// Bytes read from it since the server last wrote to it.
    read_since_write: AtomicU64,
    /// Closes the connection at once.
    kill: tokio::sync::Notify,
    /// Set once it was chosen for eviction, so that it is not chosen twice.
    evicted: std::sync::atomic::AtomicBool,
    /// Set once it holds a permit: only then does closing it make room.
    admitted: std::sync::atomic::AtomicBool,
    /// Set once one of its requests was answered.
    served: std::sync::atomic::AtomicBool,
}

impl ConnState {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Marks the connection active now.
    fn touch(&self) {
        self.last_active_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Registers a response body's stall clock.
    fn open_body(&self, handed: &Arc<AtomicU64>) {
        self.bodies.fetch_add(1, Ordering::Relaxed);
        let mut clocks = self.handed.lock().expect("stall clocks lock");
        if clocks.len() >= 64 {
            clocks.retain(|c| c.strong_count() > 0);
        }
        clocks.push(Arc::downgrade(handed));
    }

    fn close_body(&self) {
        self.bodies.fetch_sub(1, Ordering::Relaxed);
        self.touch();
    }

    /// Since when (ms) the client has left something the server has for it untaken: a
    /// socket write waiting, or a response chunk not taken; `None` when nothing waits.
    fn stalled_since(&self) -> Option<u64> {
        let mut oldest = self.write_blocked_ms.load(Ordering::Relaxed);
        let mut clocks = self.handed.lock().expect("stall clocks lock");
        clocks.retain(|c| match c.upgrade() {
            Some(c) => {
                let since = c.load(Ordering::Relaxed);
                if since != 0 && (oldest == 0 || since < oldest) {
                    oldest = since;
                }
                true
            }
            None => false,
        });
        (oldest != 0).then(|| oldest - 1)
    }

    /// Since when the connection has had no answer: its last write, or its opening.
    fn unanswered_since(&self) -> u64 {
        self.last_write_ms
            .load(Ordering::Relaxed)
            .max(self.opened_ms)
    }
}

/// The gate's open connections, and how many come from each address.
#[derive(Debug, Default)]
struct Conns {
    by_id: std::collections::HashMap<u64, Arc<ConnState>>,
    per_ip: std::collections::HashMap<IpAddr, usize>,
}

/// A cap on open connections, shared by the listeners that use it.
#[derive(Debug)]
pub struct Gate {
    name: &'static str,
    max: usize,
    /// Most connections from one address.
    per_ip: usize,
    /// The rate below which a connection without an answer counts as slow (0: none does).
    slow_rate: u64,
    permits: Arc<Semaphore>,
    refused: AtomicU64,
    evicted: AtomicU64,
    epoch: std::time::Instant,
    next_id: AtomicU64,
    conns: std::sync::Mutex<Conns>,
}

impl Gate {
    /// A gate admitting at most `max` connections at once, at most `per_ip` of them from one
    /// address, and counting a connection sending below `slow_rate` bytes per second since its
    /// last answer as slow, to be evicted for a new one (0: only idle ones are).
    pub fn new(name: &'static str, max: usize, per_ip: Option<usize>, slow_rate: u64) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Gate {
            name,
            max,
            per_ip: per_ip.unwrap_or(max).max(1),
            slow_rate,
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

    /// Records a new connection from `ip`; `false` in the answer when its address already has
    /// `per_ip` connections.
    fn register(&self, ip: IpAddr) -> (u64, Arc<ConnState>, bool) {
        let now = self.now_ms();
        let state = Arc::new(ConnState {
            epoch: self.epoch,
            ip,
            opened_ms: now,
            in_flight: AtomicUsize::new(0),
            receiving: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(now),
            bodies: AtomicUsize::new(0),
            handed: Default::default(),
            write_blocked_ms: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(now),
            read_since_write: AtomicU64::new(0),
            kill: tokio::sync::Notify::new(),
            evicted: std::sync::atomic::AtomicBool::new(false),
            admitted: std::sync::atomic::AtomicBool::new(false),
            served: std::sync::atomic::AtomicBool::new(false),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.conns.lock().expect("connections lock");
        conns.by_id.insert(id, state.clone());
        let n = conns.per_ip.entry(ip).or_insert(0);
        *n += 1;
        let within = *n <= self.per_ip;
        (id, state, within)
    }

    fn unregister(&self, id: u64) {
        let mut conns = self.conns.lock().expect("connections lock");
        if let Some(state) = conns.by_id.remove(&id) {
            if let Some(n) = conns.per_ip.get_mut(&state.ip) {
                *n -= 1;
                if *n == 0 {
                    conns.per_ip.remove(&state.ip);
                }
            }
        }
    }

    /// Closes the worst connection (of `ip` only, when given) to make room for a new one.
    ///
    /// Without a slow rate, only an idle one qualifies (no request in flight, no bytes for
    /// [`EVICT_AFTER`]), the idlest first. With one, so does any connection still sending a
    /// request or with none in flight, unless it has shown for [`EVICT_AFTER`] since its last
    /// answer that it sends at least the slow rate; one never answered before one that was, and
    /// then the one unanswered longest. A
    /// connection whose request is with its model is never chosen, and a new connection is the
    /// last to go, so slow clients that reconnect as soon as they are cut mostly evict each
    /// other, while a health check is answered in the meantime.
    fn evict_worst(&self, ip: Option<IpAddr>) -> bool {
        let now = self.now_ms();
        let grace = EVICT_AFTER.as_millis() as u64;
        let conns = self.conns.lock().expect("connections lock");
        let mine = conns
            .by_id
            .values()
            .filter(|c| ip.is_none_or(|ip| c.ip == ip))
            .filter(|c| c.admitted.load(Ordering::Relaxed) && !c.evicted.load(Ordering::Relaxed))
            // An open response (a stream) is with its client: the write timeout watches it.
            .filter(|c| c.bodies.load(Ordering::Relaxed) == 0);
        let victim = if self.slow_rate == 0 {
            mine.filter(|c| c.in_flight.load(Ordering::Relaxed) == 0)
                .map(|c| (c.last_active_ms.load(Ordering::Relaxed), c))
                .filter(|(last, _)| now.saturating_sub(*last) >= grace)
                .min_by_key(|(last, _)| *last)
                .map(|(_, c)| c)
        } else {
            mine.filter(|c| {
                c.in_flight.load(Ordering::Relaxed) == 0 || c.receiving.load(Ordering::Relaxed) > 0
            })
            .map(|c| (c.unanswered_since(), c))
            .filter(|(since, c)| {
                let waited = now.saturating_sub(*since);
                // bytes per second since the last answer, in integer arithmetic
                let rate = c.read_since_write.load(Ordering::Relaxed) * 1000 / waited.max(1);
                waited < grace || rate < self.slow_rate
            })
            // Connections never answered go before those that were (keep-alive clients).
            .min_by_key(|(since, c)| (c.served.load(Ordering::Relaxed), *since))
            .map(|(_, c)| c)
        };
        match victim {
            Some(c) => {
                c.evicted.store(true, Ordering::Relaxed);
                c.kill.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Closes a connection the cap has no room for at once, releasing its file descriptor
    /// rather than letting refused connections pile up.
    fn refuse(&self, tcp: TcpStream, peer: SocketAddr, why: &str) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                listener = self.name,
                %peer,
                max = self.max,
                per_ip = self.per_ip,
                refused = n,
                "connection refused: {why}"
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

/// Whether a request is gRPC, whose streams may rest between messages as long as they like.
fn is_grpc(req: &hyper::Request<hyper::body::Incoming>) -> bool {
    req.headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
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
        let (id, state, within) = gate.register(peer.ip());
        let conn = Conn {
            builder: builder.clone(),
            router: router.clone(),
            limits: limits.clone(),
            gate: gate.clone(),
            tls: tls.clone(),
            stop: shutdown.clone(),
            id,
            state,
        };
        if !within && !gate.evict_worst(Some(peer.ip())) {
            gate.unregister(id);
            gate.refuse(tcp, peer, "the per-address connection limit is reached");
            continue;
        }
        match gate.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(crate::coalesce::Coalesce::new(conn.run(tcp, peer, permit)));
            }
            Err(_) if gate.evict_worst(None) => {
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
                        _ => {
                            conn.gate.unregister(conn.id);
                            conn.gate
                                .refuse(tcp, peer, "the connection limit is reached");
                        }
                    }
                });
            }
            Err(_) => {
                gate.unregister(id);
                gate.refuse(tcp, peer, "the connection limit is reached");
            }
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
    /// Its entry in the gate.
    id: u64,
    state: Arc<ConnState>,
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
            id,
            state,
        } = self;
        state.admitted.store(true, Ordering::Relaxed);
        // Small responses and HTTP/2 frames must not wait for Nagle's algorithm (a 40 ms
        // stall with delayed ACKs).
        let _ = tcp.set_nodelay(true);
        let io = IdleIo {
            inner: tcp,
            idle: limits.idle_timeout,
            write_timeout: limits.stream_write_timeout,
            timer: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            state: state.clone(),
            peer,
        };
        let conn_state = state.clone();
        let min_rate = limits.min_data_rate;
        let slots = DecoupledSlots(Arc::new(Semaphore::new(
            limits.max_decoupled_per_connection.max(1),
        )));
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let guard = InFlight::new(&conn_state);
                let rate = if is_grpc(&req) { 0 } else { min_rate };
                let mut req = req.map(|body| Paced::new(body, &conn_state, rate));
                req.extensions_mut().insert(slots.clone());
                let call = tower_call(router.clone(), req);
                let conn_state = conn_state.clone();
                async move {
                    let resp = call.await;
                    drop(guard);
                    resp.map(|r| {
                        r.map(|body| axum::body::Body::new(Written::new(body, &conn_state)))
                    })
                }
            });
        match tls {
            None => run_conn(&builder, io, service, &state, stop, peer).await,
            Some(acceptor) => {
                let handshake = acceptor.accept(io);
                match tokio::time::timeout(limits.tls_handshake_timeout, handshake).await {
                    Ok(Ok(tls_io)) => run_conn(&builder, tls_io, service, &state, stop, peer).await,
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            }
        }
        gate.unregister(id);
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
    req: hyper::Request<Paced>,
) -> impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> {
    use tower_service::Service;
    let mut router = router;
    router.call(req.map(axum::body::Body::new))
}
