//! The queue: requests by priority level, counted by shape, and in-order delivery.

use super::*;

/// Elements in `request`'s inputs.
pub(crate) fn input_elements(request: &InferRequest) -> u64 {
    request
        .inputs
        .iter()
        .map(|t| t.element_count() as u64)
        .fold(0, u64::saturating_add)
}

pub(crate) struct Job {
    pub(crate) request: InferRequest,
    pub(crate) respond: Responder,
    pub(crate) rows: usize,
    pub(crate) shape_key: u64,
    pub(crate) enqueued: Instant,
    pub(crate) deadline: Option<Instant>,
    /// When it is answered with a timeout if it has not started by then: its queue deadline
    /// under a REJECT policy (kept while it waits for the rate limiter's resources, where it
    /// is still queued in Triton's sense).
    pub(crate) reject_at: Option<Instant>,
    pub(crate) seq: u64,
    /// The only instance that may run it (a sequence's instance).
    pub(crate) affinity: Option<usize>,
}

#[derive(Default)]
pub(crate) struct Level {
    pub(crate) queue: VecDeque<Job>,
    /// Timed-out requests under DELAY: served after this level's in-time requests.
    pub(crate) delayed: VecDeque<Job>,
    /// No request in `queue` has a deadline before this (`None`: none has a deadline). A lower
    /// bound: it is lowered when a request comes in and made exact when `expire` scans, and
    /// taking requests out leaves it as it is. It saves scanning a deep queue under the lock
    /// each time an instance looks for work.
    pub(crate) earliest_deadline: Option<Instant>,
    /// Some request in `queue` has an earlier deadline than one ahead of it (a request without
    /// a deadline counts as never expiring). While not, the requests that timed out are a
    /// prefix of the queue and the front's deadline is the earliest, so expiring costs no scan:
    /// the case of a level whose requests all take its default timeout.
    pub(crate) out_of_order: bool,
}

/// `a` passes after `b` (`None`: never).
pub(crate) fn passes_after(a: Option<Instant>, b: Option<Instant>) -> bool {
    match (a, b) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(a), Some(b)) => a > b,
    }
}

pub(crate) struct State {
    pub(crate) levels: Vec<Level>,
    /// The queued requests by shape (counted with the dynamic batcher only).
    pub(crate) shapes: Shapes,
    pub(crate) stopping: bool,
    /// Instances asked to leave (resize down): the next idle ones exit.
    pub(crate) retiring: usize,
    pub(crate) next_seq: u64,
    pub(crate) queued: usize,
    /// The timeout thread leaves (set once every instance thread has left).
    pub(crate) timeouts_done: bool,
}

/// Queued requests (every level, DELAY queues included) that any instance may take, counted by
/// shape: a dynamic batch that holds every one of its shape stops looking, so a shape seen
/// once costs no scan of the queue. Requests pinned to an instance (sequences) are not counted,
/// and nothing is without the dynamic batcher, which never looks past the oldest request.
pub(crate) struct Shapes {
    pub(crate) counting: bool,
    pub(crate) unpinned: usize,
    pub(crate) by_key: std::collections::HashMap<u64, usize>,
}

impl Shapes {
    pub(crate) fn new(counting: bool) -> Self {
        Shapes {
            counting,
            unpinned: 0,
            by_key: Default::default(),
        }
    }

    pub(crate) fn add(&mut self, j: &Job) {
        if self.counting && j.affinity.is_none() {
            self.unpinned += 1;
            *self.by_key.entry(j.shape_key).or_default() += 1;
        }
    }

    pub(crate) fn remove(&mut self, j: &Job) {
        if !self.counting || j.affinity.is_some() {
            return;
        }
        self.unpinned -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.by_key.entry(j.shape_key) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    pub(crate) fn count(&self, key: u64) -> usize {
        self.by_key.get(&key).copied().unwrap_or(0)
    }
}

impl State {
    /// Takes `jobs`, just taken out of the queues, out of the counts of queued requests.
    pub(crate) fn left_queue(&mut self, jobs: &[Job]) {
        self.queued -= jobs.len();
        for j in jobs {
            self.shapes.remove(j);
        }
    }

    /// A lower bound on the earliest deadline of a request queued at a level whose timeout
    /// action `of` accepts (see [`Level::earliest_deadline`]): waiting until then wakes no
    /// later than needed.
    pub(crate) fn earliest_deadline(
        &self,
        policy: &Policy,
        of: impl Fn(TimeoutAction) -> bool,
    ) -> Option<Instant> {
        self.levels
            .iter()
            .zip(&policy.levels)
            .filter(|(_, p)| of(p.action))
            .filter_map(|(lv, _)| lv.earliest_deadline)
            .min()
    }
}

/// Response delivery in request order (`preserve_ordering`).
#[derive(Default)]
pub(crate) struct Ordered {
    pub(crate) next: u64,
    pub(crate) ready: BTreeMap<u64, (Responder, Result<InferResponse>)>,
}

/// Hash of every input's name and non-batch dims: only equal keys batch together.
pub(crate) fn shape_key(req: &InferRequest, batched: bool) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut inputs: Vec<_> = req.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    for t in inputs {
        t.name.hash(&mut h);
        let dims = if batched && !t.shape.is_empty() {
            &t.shape[1..]
        } else {
            &t.shape[..]
        };
        dims.hash(&mut h);
    }
    h.finish()
}
