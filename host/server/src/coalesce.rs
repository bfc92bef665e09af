//! Wakes a connection's task gives itself, handled in place.
//!
//! An HTTP/1 connection's handler runs inside the connection's task, and hyper hands the request
//! body from the connection to the handler through a channel, so serving one request with a
//! body wakes that task from within its own poll (the handler waits for the body, the
//! connection reads it and wakes the handler). Tokio treats such a wake as a yield: the task
//! goes to the back of the run queue, and a parked worker thread is woken to come and steal it.
//! That thread finds nothing to do and parks again, and on a small machine or a VM the wake-up
//! costs about as much as the rest of a tiny model's request (`benches/`, the http suite).
//!
//! [`Coalesce`] polls its future with a waker of its own. A wake that arrives while the future is
//! being polled is remembered, and the future is polled again at once, up to [`ROUNDS`] times;
//! a wake that arrives after the poll has returned goes to the task's waker as usual. After
//! [`ROUNDS`] rounds the task yields for real, so a future that keeps waking itself cannot starve
//! the others on its worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls in a row before a self-waking future yields to the scheduler.
pub const ROUNDS: usize = 8;

/// Not being polled: a wake goes to the task.
const IDLE: u8 = 0;
/// Being polled, not woken yet.
const POLLING: u8 = 1;
/// Being polled, and woken meanwhile: poll again.
const WOKEN: u8 = 2;

struct Signal {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // While a poll is running the wake is remembered for it (the poll's closing swap sees
        // it); otherwise it is the task's.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            match state {
                POLLING => match self.state.compare_exchange(
                    POLLING,
                    WOKEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(now) => state = now,
                },
                WOKEN => return,
                _ => return self.task.wake(),
            }
        }
    }
}

/// `inner`, with the wakes it gives itself while being polled handled in place (see the module
/// docs).
pub struct Coalesce<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

impl<F: Future> Coalesce<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        Coalesce {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for Coalesce<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.signal.task.register(cx.waker());
        for _ in 0..ROUNDS {
            this.signal.state.store(POLLING, Ordering::Release);
            let mut inner_cx = Context::from_waker(&this.waker);
            if let Poll::Ready(out) = this.inner.as_mut().poll(&mut inner_cx) {
                this.signal.state.store(IDLE, Ordering::Release);
                return Poll::Ready(out);
            }
            // A wake after this swap finds IDLE and goes to the task; one before it is ours.
            if this.signal.state.swap(IDLE, Ordering::AcqRel) != WOKEN {
                return Poll::Pending;
            }
        }
        // Still waking itself: yield to the other tasks, and come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes the task gets.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself `n` times, then is ready; counts its polls.
    struct SelfWaking {
        left: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for SelfWaking {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.left == 0 {
                return Poll::Ready(());
            }
            self.left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        (count, waker)
    }

    #[test]
    fn a_wake_during_the_poll_is_polled_again_without_the_task() {
        let (count, waker) = task();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut f = std::pin::pin!(Coalesce::new(SelfWaking {
            left: 2,
            polls: polls.clone(),
        }));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(f.as_mut().poll(&mut cx), Poll::Ready(()));
        assert_eq!(polls.load(Ordering::SeqCst), 3);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was not woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_after_the_rounds() {
        let (count, waker) = task();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut f = std::pin::pin!(Coalesce::new(SelfWaking {
            left: usize::MAX,
            polls: polls.clone(),
        }));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(f.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(polls.load(Ordering::SeqCst), ROUNDS);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "it yields by waking the task"
        );
    }

    #[test]
    fn a_wake_after_the_poll_goes_to_the_task() {
        let (count, waker) = task();
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let mut f = std::pin::pin!(Coalesce::new(rx));
        let mut cx = Context::from_waker(&waker);
        assert!(f.as_mut().poll(&mut cx).is_pending());
        std::thread::spawn(move || tx.send(7).unwrap())
            .join()
            .unwrap();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the sender's wake reached the task"
        );
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(7))));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_from_other_threads_are_never_lost() {
        // Many round trips where the wake races the end of a poll.
        for i in 0..2000u32 {
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let sender = std::thread::spawn(move || tx.send(i));
            assert_eq!(Coalesce::new(rx).await.unwrap(), i);
            sender.join().unwrap().unwrap();
        }
    }
}
