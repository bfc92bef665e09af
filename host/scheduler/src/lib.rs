//! `wisp-scheduler`: the per-model queue between front ends and backend instances.
//!
//! The contract is three verbs, as in Triton's scheduler: [`Scheduler::enqueue`] a request with
//! a callback for its response, read the [`Scheduler::inflight`] count, and [`Scheduler::stop`].
//! Each instance runs on its own dedicated OS thread (never on the async runtime), takes the
//! oldest queued request, executes it, and calls the callback from that thread. A panicking
//! backend fails only the requests it was executing; the instance thread keeps serving.
//!
//! This version serves requests first-in first-out, one per execution; dynamic batching plugs in
//! behind the same three verbs.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use wisp_core::backend::Instance;
use wisp_core::{Error, InferRequest, InferResponse, Result};

/// Called exactly once with the request's outcome, on an instance thread.
pub type Responder = Box<dyn FnOnce(Result<InferResponse>) + Send>;

struct Job {
    request: InferRequest,
    respond: Responder,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    stopping: bool,
}

struct Shared {
    model: String,
    state: Mutex<State>,
    ready: Condvar,
    inflight: AtomicUsize,
}

/// A model version's queue and its instance threads.
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts one thread per instance, named `wisp-<model>-<n>`.
    pub fn start(model: &str, instances: Vec<Box<dyn Instance>>) -> Result<Self> {
        let shared = Arc::new(Shared {
            model: model.to_string(),
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            inflight: AtomicUsize::new(0),
        });
        let mut threads = Vec::new();
        for (i, instance) in instances.into_iter().enumerate() {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("wisp-{model}-{i}"))
                .spawn(move || run_instance(&shared, instance))
                .map_err(|e| Error::internal(format!("cannot start instance thread: {e}")))?;
            threads.push(handle);
        }
        Ok(Scheduler {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Queues a request; `respond` is called once with its outcome. Fails at once (without
    /// calling `respond`) when the scheduler is stopping.
    pub fn enqueue(&self, request: InferRequest, respond: Responder) -> Result<()> {
        let mut state = self.shared.state.lock().expect("scheduler lock");
        if state.stopping {
            return Err(Error::unavailable(format!(
                "model '{}' is unloading",
                self.shared.model
            )));
        }
        self.shared.inflight.fetch_add(1, Ordering::SeqCst);
        state.jobs.push_back(Job { request, respond });
        drop(state);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Requests queued or executing.
    pub fn inflight(&self) -> usize {
        self.shared.inflight.load(Ordering::SeqCst)
    }

    /// Stops accepting requests; queued ones still run. Returns once every instance thread has
    /// finished (call from a blocking context).
    pub fn stop(&self) {
        self.shared.state.lock().expect("scheduler lock").stopping = true;
        self.shared.ready.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_instance(shared: &Shared, mut instance: Box<dyn Instance>) {
    loop {
        let job = {
            let mut state = shared.state.lock().expect("scheduler lock");
            loop {
                if let Some(job) = state.jobs.pop_front() {
                    break job;
                }
                if state.stopping {
                    return;
                }
                state = shared.ready.wait(state).expect("scheduler lock");
            }
        };
        let batch = [job.request];
        let result = catch_unwind(AssertUnwindSafe(|| instance.execute(&batch)));
        let outcome = match result {
            Ok(mut v) if v.len() == 1 => v.remove(0),
            Ok(v) => Err(Error::internal(format!(
                "model '{}': backend returned {} responses for 1 request",
                shared.model,
                v.len()
            ))),
            Err(_) => Err(Error::internal(format!(
                "model '{}': backend panicked while executing",
                shared.model
            ))),
        };
        shared.inflight.fetch_sub(1, Ordering::SeqCst);
        (job.respond)(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use wisp_core::{DataType, Tensor};

    struct Echo;
    impl Instance for Echo {
        fn execute(&mut self, batch: &[InferRequest]) -> Vec<Result<InferResponse>> {
            batch
                .iter()
                .map(|r| {
                    if r.id == "panic" {
                        panic!("boom");
                    }
                    Ok(InferResponse {
                        outputs: r.inputs.clone(),
                    })
                })
                .collect()
        }
    }

    fn req(id: &str) -> InferRequest {
        InferRequest {
            id: id.into(),
            inputs: vec![Tensor::new("x", DataType::Uint8, vec![1], vec![7].into()).unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn serves_every_request_and_survives_a_panic() {
        let s = Scheduler::start("echo", vec![Box::new(Echo), Box::new(Echo)]).unwrap();
        let (tx, rx) = mpsc::channel();
        for id in ["a", "panic", "b", "c"] {
            let tx = tx.clone();
            let id2 = id.to_string();
            s.enqueue(req(id), Box::new(move |r| tx.send((id2, r)).unwrap()))
                .unwrap();
        }
        let mut got: Vec<(String, bool)> = (0..4)
            .map(|_| {
                let (id, r) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
                (id, r.is_ok())
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("a".into(), true),
                ("b".into(), true),
                ("c".into(), true),
                ("panic".into(), false)
            ]
        );
        assert_eq!(s.inflight(), 0);
    }

    #[test]
    fn stop_drains_then_rejects() {
        let s = Scheduler::start("echo", vec![Box::new(Echo)]).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..20 {
            let tx = tx.clone();
            s.enqueue(
                req(&i.to_string()),
                Box::new(move |r| tx.send(r.is_ok()).unwrap()),
            )
            .unwrap();
        }
        s.stop();
        assert_eq!(rx.try_iter().filter(|ok| *ok).count(), 20);
        let e = s.enqueue(req("late"), Box::new(|_| {})).unwrap_err();
        assert_eq!(e.kind(), wisp_core::ErrorKind::Unavailable);
    }
}
