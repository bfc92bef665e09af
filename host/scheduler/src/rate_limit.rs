//! Triton's rate limiter (`--rate-limit execution_count`): an instance executes only while the
//! resources its `instance_group { rate_limiter { resources [...] priority } }` names are free,
//! so heavy or looping instances of one model cannot take every core from a cheap model that
//! shares a resource with them.
//!
//! Resources are counted, server-wide. A resource's total is what `--rate-limit-resource`
//! gives it, or else the most any one instance of a loaded model asks for (Triton's default:
//! at least one such instance can always run), recomputed as models load and unload, so that
//! a model gone no longer sets anyone's limit. A batch waiting for its instance's resources is
//! still queued: its requests' REJECT queue timeouts apply ([`RateLimiter::acquire_until`]). Waiting instances are served by weighted turns, as Triton's
//! `priority` is: an instance of priority 2 gets half the turns of one of priority 1 when both
//! wait (virtual time, as in weighted fair queueing: an instance that executes often, briefly,
//! is not put behind ones that execute rarely but long). An instance whose group names no resources is never held back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};

use wisp_core::{Error, Result};

/// Most of one resource an instance may ask for, or a flag may provide.
pub const MAX_RESOURCE_COUNT: u64 = 1 << 20;
/// Largest `priority` accepted (Triton's is a uint32; weights beyond this change nothing real).
pub const MAX_PRIORITY: u64 = 1 << 20;

/// What one instance needs to execute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    /// `(resource, count)`, each resource once.
    pub resources: Vec<(String, u64)>,
    /// Triton's `priority`: the weight of one turn (0 counts as 1).
    pub priority: u64,
}

/// The server-wide resource pool.
#[derive(Debug, Default)]
pub struct RateLimiter {
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Totals fixed by `--rate-limit-resource`.
    fixed: HashMap<String, u64>,
    /// Each resource's total (fixed, or the largest need seen).
    total: HashMap<String, u64>,
    /// In use now.
    used: HashMap<String, u64>,
    /// Waiters by (weighted turns taken, arrival), with what they need.
    waiting: BTreeMap<(u64, u64), Needs>,
    /// Per instance, the turn at which it may next go (its last turn plus its priority).
    turns: HashMap<usize, u64>,
    /// The turn of the latest grant.
    now: u64,
    next_arrival: u64,
    /// The needs of every loaded model's instances, by [`Hold`].
    held: HashMap<u64, Vec<Needs>>,
    next_hold: u64,
}

impl State {
    /// Each resource's total: fixed by a flag, or the most a held need asks for.
    fn recompute(&mut self) {
        let mut total = self.fixed.clone();
        for needs in self.held.values().flatten() {
            for (r, n) in &needs.resources {
                if !self.fixed.contains_key(r) {
                    let t = total.entry(r.clone()).or_insert(0);
                    *t = (*t).max(*n);
                }
            }
        }
        self.total = total;
    }
}

/// A loaded model's instances' needs, counted in the totals until dropped (when the model's
/// scheduler goes).
#[derive(Debug)]
pub struct Hold {
    limiter: Arc<RateLimiter>,
    id: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut s = self.limiter.lock();
        s.held.remove(&self.id);
        s.recompute();
        drop(s);
        self.limiter.freed.notify_all();
    }
}

/// Resources held by an executing instance; given back when dropped.
pub struct Permit<'a> {
    limiter: &'a RateLimiter,
    needs: &'a Needs,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.limiter.lock();
        for (r, n) in &self.needs.resources {
            if let Some(u) = s.used.get_mut(r) {
                *u = u.saturating_sub(*n);
            }
        }
        drop(s);
        self.limiter.freed.notify_all();
    }
}

impl RateLimiter {
    /// A pool whose listed resources have fixed totals (`--rate-limit-resource`).
    pub fn new(fixed: HashMap<String, u64>) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            state: Mutex::new(State {
                total: fixed.clone(),
                fixed,
                ..State::default()
            }),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses needs a fixed total can never meet (before any of `model`'s instances runs).
    pub fn check(&self, model: &str, needs: &Needs) -> Result<()> {
        let s = self.lock();
        for (r, n) in &needs.resources {
            if let Some(&fixed) = s.fixed.get(r) {
                if *n > fixed {
                    return Err(Error::invalid(format!(
                        "model '{model}': instance_group rate_limiter asks for {n} of resource \
                         '{r}', but --rate-limit-resource provides {fixed}: it could never run"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Counts `needs` (one model's instances) in the totals of resources no flag fixed, until
    /// the returned hold drops.
    pub fn hold(self: &Arc<Self>, needs: Vec<Needs>) -> Hold {
        let mut s = self.lock();
        let id = s.next_hold;
        s.next_hold += 1;
        s.held.insert(id, needs);
        s.recompute();
        drop(s);
        self.freed.notify_all();
        Hold {
            limiter: self.clone(),
            id,
        }
    }

    /// Waits until `needs` fits and it is this waiter's turn, then holds the resources until
    /// the permit drops. `who` identifies the instance (for its weighted turns). Of the
    /// waiters, the first in turn order whose needs fit goes: one that cannot fit yet does not
    /// hold back those behind it, and among those that fit, fewer weighted turns go first.
    pub fn acquire<'a>(&'a self, who: usize, needs: &'a Needs) -> Permit<'a> {
        self.acquire_until(who, needs, None)
            .expect("without a deadline, the wait ends with the resources")
    }

    /// [`RateLimiter::acquire`], giving up at `until` (`None`: never).
    pub fn acquire_until<'a>(
        &'a self,
        who: usize,
        needs: &'a Needs,
        until: Option<std::time::Instant>,
    ) -> Option<Permit<'a>> {
        let mut s = self.lock();
        // An instance that has not waited for a while starts at the current turn, not at the
        // few turns it took long ago (nor does one that runs often owe the turns it took while
        // no one else waited): turns count only while instances compete.
        let turn = s.turns.get(&who).copied().unwrap_or(0).max(s.now);
        let key = (turn, s.next_arrival);
        s.next_arrival += 1;
        s.waiting.insert(key, needs.clone());
        loop {
            let next = s.waiting.iter().find(|(_, n)| fits(&s, n)).map(|(k, _)| *k);
            if next == Some(key) {
                s.waiting.remove(&key);
                for (r, n) in &needs.resources {
                    *s.used.entry(r.clone()).or_insert(0) += n;
                }
                s.turns
                    .insert(who, turn.saturating_add(needs.priority.max(1)));
                s.now = s.now.max(turn);
                drop(s);
                // the others look again: the next in turn may fit what is left
                self.freed.notify_all();
                return Some(Permit {
                    limiter: self,
                    needs,
                });
            }
            match until {
                None => {
                    s = self
                        .freed
                        .wait(s)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                Some(until) => {
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        s.waiting.remove(&key);
                        drop(s);
                        // one that fits behind this waiter may go now
                        self.freed.notify_all();
                        return None;
                    }
                    s = self
                        .freed
                        .wait_timeout(s, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            }
        }
    }
}

fn fits(s: &State, needs: &Needs) -> bool {
    needs.resources.iter().all(|(r, n)| {
        let total = s.total.get(r).copied().unwrap_or(0);
        let used = s.used.get(r).copied().unwrap_or(0);
        used.saturating_add(*n) <= total
    })
}

/// Parses one `--rate-limit-resource` value, Triton's `<name>:<count>` or
/// `<name>:<count>:<device>` (the device is accepted and ignored: Wisp's instances are CPU).
pub fn parse_resource_flag(value: &str) -> Result<(String, u64)> {
    let parts: Vec<&str> = value.split(':').collect();
    let (name, count) = match parts.as_slice() {
        [name, count] | [name, count, _] => (name.trim(), count.trim()),
        _ => {
            return Err(Error::invalid(format!(
                "--rate-limit-resource '{value}': expected <name>:<count>[:<device>]"
            )))
        }
    };
    let count: u64 = count
        .parse()
        .ok()
        .filter(|&n| n <= MAX_RESOURCE_COUNT)
        .ok_or_else(|| {
            Error::invalid(format!(
                "--rate-limit-resource '{value}': the count must be an integer in 0..={MAX_RESOURCE_COUNT}"
            ))
        })?;
    if name.is_empty() {
        return Err(Error::invalid(format!(
            "--rate-limit-resource '{value}': the resource needs a name"
        )));
    }
    Ok((name.to_string(), count))
}

#[cfg(test)]
impl RateLimiter {
    /// How many wait now.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn needs(r: &str, n: u64, priority: u64) -> Needs {
        Needs {
            resources: vec![(r.to_string(), n)],
            priority,
        }
    }

    fn wait_for_waiters(l: &RateLimiter, n: usize) {
        let until = Instant::now() + Duration::from_secs(10);
        while l.waiting() < n {
            assert!(Instant::now() < until, "waiters never queued");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn totals_follow_the_loaded_models_and_a_fixed_total_refuses_more() {
        let l = RateLimiter::new(HashMap::from([("fixed".to_string(), 2)]));
        let small = l.hold(vec![needs("free", 1, 1)]);
        let big = l.hold(vec![needs("free", 3, 1), needs("fixed", 2, 1)]);
        assert_eq!(l.lock().total["free"], 3);
        assert_eq!(l.lock().total["fixed"], 2);
        // The model asking for 3 unloads: its ask no longer sets anyone's limit.
        drop(big);
        assert_eq!(l.lock().total["free"], 1);
        assert_eq!(l.lock().total["fixed"], 2, "a flag's total stays");
        drop(small);
        assert!(!l.lock().total.contains_key("free"));
        let e = l.check("m", &needs("fixed", 3, 1)).unwrap_err();
        assert!(
            e.message().contains("provides 2: it could never run"),
            "{e}"
        );
        l.check("m", &needs("free", 1 << 20, 1)).unwrap();
    }

    #[test]
    fn a_waiter_gives_up_at_its_deadline_and_leaves_the_line() {
        let l = RateLimiter::new(HashMap::from([("R".to_string(), 1)]));
        let one = needs("R", 1, 1);
        let held = l.acquire(0, &one);
        let started = Instant::now();
        let until = started + Duration::from_millis(50);
        assert!(l.acquire_until(1, &one, Some(until)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(l.waiting(), 0, "it left the line");
        drop(held);
        assert!(l.acquire_until(1, &one, Some(Instant::now())).is_some());
    }

    #[test]
    fn a_lower_weighted_turn_goes_first_and_a_waiter_that_fits_is_not_held_back() {
        let l = RateLimiter::new(HashMap::from([("R".to_string(), 1), ("S".to_string(), 1)]));
        let (a, b) = (needs("R", 1, 1), needs("R", 1, 2));
        // one turn each: a has taken 1 weighted turn, b 2
        drop(l.acquire(1, &a));
        drop(l.acquire(2, &b));
        let hold = needs("R", 1, 1);
        let held = l.acquire(0, &hold);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            // b arrives first, a second: a still goes first, having fewer weighted turns
            for (who, n) in [(2usize, &b), (1, &a)] {
                let tx = tx.clone();
                let l = &l;
                s.spawn(move || {
                    let _p = l.acquire(who, n);
                    tx.send(who).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                });
                wait_for_waiters(l, if who == 2 { 1 } else { 2 });
            }
            // a waiter on another resource is not held back by those waiting on R
            drop(l.acquire(3, &needs("S", 1, 1)));
            drop(held);
        });
        let order: Vec<usize> = rx.try_iter().collect();
        assert_eq!(order, vec![1, 2]);
    }
}
