//! Slow-client defences on one connection: the idle timer around its I/O, the in-flight mark, and the minimum body data rate.

use super::*;

/// Wraps a TCP stream: fails with `TimedOut` once the connection has been idle for `idle`
/// (no request in flight and no body bytes either way: control frames do not count), or once
/// its client has left a response untaken for `write_timeout` (a socket write waiting, or a
/// response chunk hyper could not send for want of the client's flow-control window).
pub(super) struct IdleIo {
    pub(super) inner: TcpStream,
    pub(super) idle: Duration,
    pub(super) write_timeout: Duration,
    pub(super) timer: Pin<Box<Sleep>>,
    pub(super) state: Arc<ConnState>,
    pub(super) peer: SocketAddr,
}

impl IdleIo {
    /// A write's outcome: progress stops the write-stall clock; a stall starts it and checks.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match polled {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    let now = self.state.now_ms();
                    self.state.write_blocked_ms.store(0, Ordering::Relaxed);
                    self.state.last_write_ms.store(now, Ordering::Relaxed);
                    self.state.read_since_write.store(0, Ordering::Relaxed);
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => {
                let now = self.state.now_ms();
                let _ = self.state.write_blocked_ms.compare_exchange(
                    0,
                    now + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                match self.check(cx) {
                    Ok(()) => Poll::Pending,
                    Err(e) => Poll::Ready(Err(e)),
                }
            }
            other => other,
        }
    }

    /// Fails the connection if it is idle or its client has stalled; otherwise arms the timer
    /// for the next moment either could happen.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let state = &self.state;
        let now = state.now_ms();
        let write_ms = self.write_timeout.as_millis() as u64;
        let mut next = u64::MAX;
        if let Some(since) = state.stalled_since() {
            if now.saturating_sub(since) >= write_ms {
                tracing::info!(peer = %self.peer, secs = self.write_timeout.as_secs_f32(),
                    "closing a connection whose client took none of its responses (--stream-write-timeout)");
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "stream write timeout",
                ));
            }
            next = since + write_ms;
        }
        if state.in_flight.load(Ordering::Relaxed) > 0 {
            state.last_active_ms.store(now, Ordering::Relaxed);
        }
        let idle_at = state
            .last_active_ms
            .load(Ordering::Relaxed)
            .saturating_add(self.idle.as_millis() as u64);
        if now >= idle_at {
            tracing::info!(peer = %self.peer, secs = self.idle.as_secs(), "closing idle connection");
            return Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
        }
        next = next.min(idle_at);
        if state.bodies.load(Ordering::Relaxed) > 0 {
            // A response body starts its stall clock from its own task: look again soon.
            next = next.min(now + (write_ms / 4).max(50));
        }
        let at = Instant::from_std(state.epoch + Duration::from_millis(next));
        if self.timer.deadline() != at {
            self.timer.as_mut().reset(at);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
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
        state.touch();
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
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
                    if let Some(state) = &self.state {
                        state.touch();
                    }
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
