//! Slow-client defences on one connection: the idle timer around its I/O, the in-flight mark, and the minimum body data rate.

use super::*;

/// Wraps a TCP stream: fails with `TimedOut` once no bytes have moved either way for
/// `idle` while the connection has no request in flight; tells the gate when bytes move.
pub(super) struct IdleIo {
    pub(super) inner: TcpStream,
    pub(super) idle: Duration,
    pub(super) timer: Pin<Box<Sleep>>,
    pub(super) state: Arc<ConnState>,
    pub(super) gate: Arc<Gate>,
    pub(super) peer: SocketAddr,
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
                    let now = self.gate.now_ms();
                    self.state.last_write_ms.store(now, Ordering::Relaxed);
                    self.state.read_since_write.store(0, Ordering::Relaxed);
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
                let read = buf.filled().len() - before;
                if read > 0 {
                    self.touch();
                    self.state
                        .read_since_write
                        .fetch_add(read as u64, Ordering::Relaxed);
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
pub(super) struct InFlight(Arc<ConnState>);

impl InFlight {
    pub(super) fn new(state: &Arc<ConnState>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.served.store(true, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that counts as receiving on its connection until it ends and, with a
/// minimum rate, fails once it has arrived slower than that on average after [`RATE_GRACE`].
pub(super) struct Paced {
    inner: hyper::body::Incoming,
    /// Present while the body is still arriving.
    state: Option<Arc<ConnState>>,
    /// Bytes per second (0: no minimum).
    min_rate: u64,
    started: Instant,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
}

/// A body arriving too slowly.
#[derive(Debug)]
pub(super) struct TooSlow(u64);

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body arrived slower than {} bytes/s (--min-data-rate)",
            self.0
        )
    }
}

impl std::error::Error for TooSlow {}

impl Paced {
    pub(super) fn new(inner: hyper::body::Incoming, state: &Arc<ConnState>, min_rate: u64) -> Self {
        let receiving = !hyper::body::Body::is_end_stream(&inner);
        if receiving {
            state.receiving.fetch_add(1, Ordering::Relaxed);
        }
        Paced {
            inner,
            state: receiving.then(|| state.clone()),
            min_rate,
            started: Instant::now(),
            received: 0,
            timer: None,
        }
    }

    fn done(&mut self) {
        if let Some(state) = self.state.take() {
            state.receiving.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// When the body falls below the minimum rate if nothing more arrives.
    fn deadline(&self) -> Instant {
        let owed = Duration::from_millis(self.received.saturating_mul(1000) / self.min_rate.max(1));
        self.started + RATE_GRACE + owed
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.done();
    }
}

impl hyper::body::Body for Paced {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                self.done();
                Poll::Ready(None)
            }
            Poll::Pending if self.min_rate == 0 || self.state.is_none() => Poll::Pending,
            Poll::Pending => {
                let deadline = self.deadline();
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.done();
                        let rate = self.min_rate;
                        Poll::Ready(Some(Err(Box::new(TooSlow(rate)))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
