//! SLA-guarded rollout: a model whose config declares an SLA is watched for a window after each
//! reload that replaces a serving version. If the new version breaches the SLA within the window,
//! the previous version, kept loaded all along, is swapped back in (the same atomic swap as a
//! load, so no request is dropped); otherwise the previous version is released when the window
//! ends.
//!
//! The SLA is read from the model's config `parameters`:
//!
//! | key | meaning | default | bounds |
//! |---|---|---|---|
//! | `sla.p99_latency_ms` | p99 of request latency (enqueue to response) must stay at or under this | — | (0, 3 600 000] |
//! | `sla.max_error_rate` | failed requests / all requests must stay at or under this | — | [0, 1) |
//! | `sla.window_secs` | how long a new version is watched after the swap | 60 | 1 ..= 86 400 |
//! | `sla.min_requests` | requests needed before a breach is judged | 20 | 1 ..= 1 000 000 |
//!
//! A model has an SLA when it sets `sla.p99_latency_ms` or `sla.max_error_rate`. Values out of
//! bounds fail the load, naming the parameter. Latencies are kept in a fixed histogram of
//! atomics (eight buckets per power of two, so a p99 reads at most 9% high), fed by the
//! scheduler's per-request observer: recording costs a few atomic adds and no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_scheduler::{Observer, RequestTiming};

use super::entry::{ModelEntry, VersionState};

pub use wisp_core::config::params::{Sla, ERROR_RATE_KEY, P99_KEY};

/// Why `seen` breaches `sla`, or `None` when it does not (or is too small to judge).
pub fn breach(sla: &Sla, seen: &Counts) -> Option<String> {
    if seen.total < sla.min_requests {
        return None;
    }
    if let Some(max) = sla.max_error_rate {
        let rate = seen.failed as f64 / seen.total as f64;
        if rate > max {
            return Some(format!(
                "error rate {rate:.3} over {ERROR_RATE_KEY} {max} ({} of {} requests failed)",
                seen.failed, seen.total
            ));
        }
    }
    if let Some(max) = sla.p99 {
        let p99 = seen.quantile(0.99);
        if p99 > max {
            return Some(format!(
                "p99 latency {:.1} ms over {P99_KEY} {} over {} requests",
                p99.as_secs_f64() * 1000.0,
                max.as_secs_f64() * 1000.0,
                seen.total
            ));
        }
    }
    None
}
/// Buckets per power of two of microseconds.
const PER_OCTAVE: f64 = 8.0;
/// Up to 2^40 µs (12 days): anything longer shares the last bucket.
const BUCKETS: usize = 8 * 40;

/// Request outcomes of one model version: counts and a latency histogram, fed by the
/// scheduler's observer.
pub struct Probe {
    buckets: Box<[AtomicU64]>,
    failed: AtomicU64,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            failed: AtomicU64::new(0),
        }
    }
}

impl Probe {
    /// Records one completed request.
    pub fn record(&self, ok: bool, took: Duration) {
        let us = took.as_secs_f64() * 1e6;
        let i = if us <= 1.0 {
            0
        } else {
            ((us.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1)
        };
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What it has recorded so far.
    pub fn counts(&self) -> Counts {
        let hist: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        Counts {
            total: hist.iter().sum(),
            failed: self.failed.load(Ordering::Relaxed),
            hist,
        }
    }

    /// An observer that records into this probe, then calls `next` (the metrics exporter's).
    pub fn observer(self: &Arc<Self>, next: Option<Observer>) -> Observer {
        let probe = self.clone();
        Arc::new(move |t: &RequestTiming| {
            probe.record(t.ok, t.total);
            if let Some(n) = &next {
                n(t);
            }
        })
    }
}

/// Request outcomes: totals and a latency histogram (see [`Probe`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Requests completed.
    pub total: u64,
    /// Of which failed.
    pub failed: u64,
    hist: Vec<u64>,
}

impl Counts {
    /// What happened since `before` (an earlier reading of the same probe).
    pub fn since(&self, before: &Counts) -> Counts {
        let hist: Vec<u64> = self
            .hist
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(before.hist.get(i).copied().unwrap_or(0)))
            .collect();
        Counts {
            total: hist.iter().sum(),
            failed: self.failed.saturating_sub(before.failed),
            hist,
        }
    }

    /// Both together.
    pub fn add(&mut self, other: &Counts) {
        self.hist.resize(self.hist.len().max(other.hist.len()), 0);
        for (a, b) in self.hist.iter_mut().zip(&other.hist) {
            *a += b;
        }
        self.total += other.total;
        self.failed += other.failed;
    }

    /// The `q` quantile of latency, as its bucket's upper bound (zero when empty).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let upper_us = 2f64.powf((i + 1) as f64 / PER_OCTAVE);
                return Duration::from_secs_f64(upper_us / 1e6);
            }
        }
        Duration::MAX
    }
}

/// A reload under watch: the version swapped in, the one it replaced (kept loaded), and what
/// the new version's probes had recorded at the swap.
pub(super) struct Watch {
    /// The entry to swap back in on a breach.
    pub good: Arc<ModelEntry>,
    /// The new versions' probes, with their readings at the swap.
    pub probes: Vec<(Arc<Probe>, Counts)>,
    pub sla: Sla,
    pub started: Instant,
}

impl Watch {
    /// A watch of `candidate` (just swapped in) against `good`, when `candidate` declares an
    /// SLA.
    pub fn start(good: Arc<ModelEntry>, candidate: &ModelEntry) -> Option<Watch> {
        let mut sla = None;
        let mut probes = Vec::new();
        for state in candidate.versions.values() {
            if let VersionState::Ready(m) = state {
                if let (Some(s), Some(p)) = (&m.params.sla, &m.probe) {
                    sla.get_or_insert_with(|| s.clone());
                    probes.push((p.clone(), p.counts()));
                }
            }
        }
        Some(Watch {
            good,
            probes,
            sla: sla?,
            started: Instant::now(),
        })
    }

    /// Whether `entry` is the candidate this watch was started for (or an in-place resize of
    /// it, which keeps its probes).
    pub fn watches(&self, entry: &ModelEntry) -> bool {
        entry.versions.values().any(|s| match s {
            VersionState::Ready(m) => m
                .probe
                .as_ref()
                .is_some_and(|p| self.probes.iter().any(|(w, _)| Arc::ptr_eq(p, w))),
            VersionState::Unavailable(_) => false,
        })
    }

    /// The new versions' outcomes since the swap.
    pub fn seen(&self) -> Counts {
        let mut all = Counts::default();
        for (probe, before) in &self.probes {
            all.add(&probe.counts().since(before));
        }
        all
    }

    /// The verdict at `now`.
    pub fn judge(&self, now: Instant) -> Verdict {
        let seen = self.seen();
        if let Some(why) = breach(&self.sla, &seen) {
            return Verdict::RollBack(why);
        }
        if now.duration_since(self.started) >= self.sla.window {
            return Verdict::Keep(seen);
        }
        Verdict::Watching
    }
}

/// What a watch decides.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The window is still open and the SLA holds.
    Watching,
    /// The SLA was breached: why.
    RollBack(String),
    /// The window passed with the SLA held, over these requests.
    Keep(Counts),
}

/// Per-model lifecycle counts for the metrics exporter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LifecycleCounts {
    /// Loads or reloads that failed (config, files, warm-up, signature).
    pub load_failures: u64,
    /// New versions swapped back out for breaching their SLA.
    pub rollbacks: u64,
    /// New versions kept after their SLA window.
    pub kept: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_read_at_most_one_bucket_high() {
        let p = Probe::default();
        for ms in 1..=100 {
            p.record(true, Duration::from_millis(ms));
        }
        let c = p.counts();
        assert_eq!(c.total, 100);
        let p99 = c.quantile(0.99).as_secs_f64() * 1000.0;
        assert!((99.0..=99.0 * 1.1).contains(&p99), "p99 {p99} ms");
        let p50 = c.quantile(0.5).as_secs_f64() * 1000.0;
        assert!((50.0..=55.0).contains(&p50), "p50 {p50} ms");
    }

    #[test]
    fn breaches_need_enough_requests_and_say_why() {
        let sla = Sla {
            p99: Some(Duration::from_millis(10)),
            max_error_rate: Some(0.1),
            window: Duration::from_secs(60),
            min_requests: 10,
        };
        let p = Probe::default();
        let before = p.counts();
        for _ in 0..9 {
            p.record(true, Duration::from_millis(50));
        }
        assert_eq!(breach(&sla, &p.counts().since(&before)), None, "too few");
        p.record(true, Duration::from_millis(50));
        let why = breach(&sla, &p.counts().since(&before)).unwrap();
        assert!(why.contains("p99 latency"), "{why}");

        let q = Probe::default();
        for i in 0..20 {
            q.record(i % 4 != 0, Duration::from_millis(1));
        }
        let why = breach(&sla, &q.counts()).unwrap();
        assert!(why.contains("error rate 0.250"), "{why}");

        let fine = Probe::default();
        for i in 0..100 {
            fine.record(i != 0, Duration::from_millis(2));
        }
        assert_eq!(breach(&sla, &fine.counts()), None);
        // What was seen before the swap does not count.
        let at_swap = p.counts();
        for _ in 0..10 {
            p.record(true, Duration::from_millis(1));
        }
        assert_eq!(breach(&sla, &p.counts().since(&at_swap)), None);
    }
}
