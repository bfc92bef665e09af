//! The response side of a connection's pacing: every response body is handed to hyper in
//! chunks of at most [`CHUNK`] bytes, and each chunk starts a stall clock that stops when hyper
//! asks for the next one (which it does only once the client has taken room for it: HTTP/2
//! flow control, or HTTP/1's write buffer draining into the socket). The connection's I/O
//! checks those clocks ([`super::ConnState::stalled_since`]) and closes a connection whose
//! client has taken nothing for `--stream-write-timeout`, so that a client that stops reading
//! costs at most that long, whatever it does with PING frames meanwhile.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::ConnState;

/// The most one chunk handed to hyper holds. hyper's HTTP/2 side keeps one chunk buffered and
/// one waiting for room, so a stalled stream parks at most two of them in the connection. It
/// also sets the slowest reader that is never cut: one chunk per write timeout (16 KiB in 5 s,
/// about 26 kbit/s with the defaults).
pub(super) const CHUNK: usize = 16 * 1024;

/// A response body paced by its reader (see the module docs).
pub(super) struct Written {
    inner: axum::body::Body,
    state: Arc<ConnState>,
    /// When (ms since the gate's epoch, plus one) the last chunk was handed over and not yet
    /// followed by a request for the next; 0 when hyper is not waiting on the client.
    handed: Arc<AtomicU64>,
    /// What is left of the inner body's current frame.
    rest: Bytes,
    /// Whether a data chunk was ever handed over: then the end is told by a last, empty poll
    /// (so that the last chunk's stall clock also stops only when the client has taken it).
    sent: bool,
    ended: bool,
}

impl Written {
    pub(super) fn new(inner: axum::body::Body, state: &Arc<ConnState>) -> Self {
        let handed = Arc::new(AtomicU64::new(0));
        state.open_body(&handed);
        Written {
            inner,
            state: state.clone(),
            handed,
            rest: Bytes::new(),
            sent: false,
            ended: false,
        }
    }

    /// Hands the next chunk of `rest` over, starting its stall clock.
    fn hand(&mut self) -> Bytes {
        let n = self.rest.len().min(CHUNK);
        let chunk = self.rest.split_to(n);
        let now = self.state.now_ms();
        self.state.last_active_ms.store(now, Ordering::Relaxed);
        self.handed.store(now + 1, Ordering::Relaxed);
        self.sent = true;
        chunk
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        self.handed.store(0, Ordering::Relaxed);
        self.state.close_body();
    }
}

impl Body for Written {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Asked for more: whatever was handed over before has been taken.
        self.handed.store(0, Ordering::Relaxed);
        if !self.rest.is_empty() {
            let chunk = self.hand();
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.is_empty() => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => {
                    self.rest = data;
                    let chunk = self.hand();
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (!self.sent && self.rest.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // The bytes are the inner body's, only cut differently.
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint.set_lower(hint.lower().saturating_add(rest));
        hint
    }
}
