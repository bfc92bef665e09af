//! Queue timeouts: expiring requests past their deadline (REJECT answered, DELAY moved
//! behind the in-time ones), on the timeout thread or by an instance looking for work.

use super::*;

impl Shared {
    /// Moves (DELAY) or collects (REJECT) requests whose queue timeout passed; with
    /// `reject_only`, leaves the DELAY levels alone.
    pub(crate) fn expire(
        &self,
        state: &mut State,
        now: Instant,
        rejected: &mut Vec<Job>,
        reject_only: bool,
    ) {
        for (i, lv) in state.levels.iter_mut().enumerate() {
            if lv.earliest_deadline.is_none_or(|d| d > now) {
                continue;
            }
            let action = self.policy.levels[i].action;
            if reject_only && action != TimeoutAction::Reject {
                continue;
            }
            let passed = |j: &Job| j.deadline.is_some_and(|d| d <= now);
            let mut timed_out = |j: Job| match action {
                TimeoutAction::Reject => rejected.push(j),
                TimeoutAction::Delay => lv.delayed.push_back(Job {
                    deadline: None,
                    ..j
                }),
            };
            if !lv.out_of_order {
                while lv.queue.front().is_some_and(passed) {
                    timed_out(lv.queue.pop_front().expect("the front is there"));
                }
                lv.earliest_deadline = lv.queue.front().and_then(|j| j.deadline);
                continue;
            }
            // Out of order: the requests before the first timed-out one stay where they are
            // (read, not moved); the rest are taken off and the in-time ones put back. When
            // the sooner deadlines are the later requests (each asks for less time than the
            // one before it), that is a read of the queue and a short tail.
            let mut out_of_order = false;
            let mut last: Option<Option<Instant>> = None;
            let mut earliest: Option<Instant> = None;
            let mut note = |j: &Job| {
                if let Some(l) = last {
                    out_of_order |= passes_after(l, j.deadline);
                }
                last = Some(j.deadline);
                if let Some(d) = j.deadline {
                    earliest = Some(earliest.map_or(d, |e| e.min(d)));
                }
            };
            let mut first = None;
            for (i, j) in lv.queue.iter().enumerate() {
                if passed(j) {
                    first = Some(i);
                    break;
                }
                note(j);
            }
            // None: the bound was stale, nothing passed, and the bound is now exact.
            if let Some(first) = first {
                for j in lv.queue.split_off(first) {
                    if passed(&j) {
                        timed_out(j);
                    } else {
                        note(&j);
                        lv.queue.push_back(j);
                    }
                }
            }
            lv.earliest_deadline = earliest;
            lv.out_of_order = out_of_order;
        }
        state.left_queue(rejected);
    }

    /// Answers requests whose queue timeout passed under REJECT (not holding the lock).
    pub(crate) fn reject_expired(&self, rejected: Vec<Job>) {
        for job in rejected {
            let msg = format!("Request timeout expired (model '{}')", self.model);
            self.finish_failed(job, Error::unavailable(msg), FailReason::Rejected);
        }
    }

    /// The earliest deadline an idle instance wakes for. With a timeout thread, REJECT
    /// deadlines are its job (an instance that woke for one would find it answered), so
    /// instances wake only for DELAY deadlines, which reorder the queue they serve.
    pub(crate) fn instance_deadline(&self, state: &State) -> Option<Instant> {
        state.earliest_deadline(&self.policy, |a| {
            !(self.timeout_thread && a == TimeoutAction::Reject)
        })
    }
}

/// The loop of the timeout thread, until the scheduler has stopped: it answers requests whose
/// REJECT deadline passes while no instance looks at the queue (all of them are executing).
/// Instances also expire requests when they look for work, so DELAY needs no thread: a delayed
/// request is only ever reordered behind others, which matters only once an instance is free.
pub(crate) fn run_timeouts(shared: &Shared) {
    let mut state = shared.state.lock().expect("scheduler lock");
    let mut last_scan: Option<Instant> = None;
    while !state.timeouts_done {
        let now = Instant::now();
        let rejects = |a| a == TimeoutAction::Reject;
        let Some(due) = state.earliest_deadline(&shared.policy, rejects) else {
            state = shared.timeouts.wait(state).expect("scheduler lock");
            continue;
        };
        let due = last_scan.map_or(due, |t| due.max(t + TIMEOUT_SCAN_GAP));
        if due > now {
            state = shared
                .timeouts
                .wait_timeout(state, due - now)
                .expect("scheduler lock")
                .0;
            continue;
        }
        // A scan also makes the levels' bounds exact, so a stale bound is passed only once.
        let mut rejected = Vec::new();
        shared.expire(&mut state, now, &mut rejected, true);
        last_scan = Some(now);
        if !rejected.is_empty() {
            drop(state);
            shared.reject_expired(rejected);
            state = shared.state.lock().expect("scheduler lock");
        }
    }
}
