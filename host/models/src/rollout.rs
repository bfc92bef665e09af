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
//! bounds fail the load, naming the parameter. Latencies are kept in fixed histograms of
//! atomics (eight buckets per power of two, so a p99 reads at most 9% high), one per size class
//! of request (inputs' elements, by power of two), fed by the scheduler's per-request observer:
//! recording costs a few atomic adds and no lock.
//!
//! **Latency is judged against the previous version on requests of the same size.** Inference
//! clients choose their requests' sizes, so an absolute p99 would let any client force a
//! rollback by sending unusually large requests right after a swap. A latency breach needs a
//! size class in which the new version has served `sla.min_requests` requests with a p99 over
//! `sla.p99_latency_ms` and over [`SLOWER_THAN_BEFORE`] times the previous version's p99 on at
//! least as many requests of that class. Sizes the previous version never served (or a previous
//! version without an SLA, which kept no histogram) give no latency verdict; the error rate is
//! judged on every request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_scheduler::{Observer, RequestTiming};

use super::entry::{ModelEntry, VersionState};

pub use wisp_core::config::params::{Sla, ERROR_RATE_KEY, P99_KEY};

/// How much slower than the previous version, on requests of the same size class, the new
/// version's p99 must be for a latency breach (above the histogram's 9% resolution and noise).
pub const SLOWER_THAN_BEFORE: f64 = 1.25;

/// Why `seen` (the new version since its swap) breaches `sla`, judged against `before` (the
/// previous version's whole history) for latency, or `None` when it does not (or is too small
/// to judge).
pub fn breach(sla: &Sla, seen: &Counts, before: &Counts) -> Option<String> {
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
    let max = sla.p99?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for class in 0..CLASSES {
        let (new, old) = (seen.class_total(class), before.class_total(class));
        if new < sla.min_requests || old < sla.min_requests {
            continue;
        }
        let (p99, was) = (
            seen.class_quantile(class, 0.99),
            before.class_quantile(class, 0.99),
        );
        if p99 > max && p99.as_secs_f64() > was.as_secs_f64() * SLOWER_THAN_BEFORE {
            return Some(format!(
                "p99 latency {:.1} ms over {P99_KEY} {} on requests of {} input elements ({new} requests), where the previous version's p99 was {:.1} ms ({old} requests)",
                ms(p99),
                ms(max),
                class_range(class),
                ms(was),
            ));
        }
    }
    None
}

/// Buckets per power of two of microseconds.
const PER_OCTAVE: f64 = 8.0;
/// Up to 2^32 µs (71 minutes): anything longer shares the last bucket.
const BUCKETS: usize = 8 * 32;
/// Size classes: requests of 0, 1, 2-3, 4-7, ... input elements; 2^31 and more share the last.
const CLASSES: usize = 33;

/// The size class of a request of `elements` input elements.
fn class_of(elements: u64) -> usize {
    ((u64::BITS - elements.leading_zeros()) as usize).min(CLASSES - 1)
}

/// The sizes `class` holds, for messages.
fn class_range(class: usize) -> String {
    match class {
        0 => "0".into(),
        1 => "1".into(),
        c if c == CLASSES - 1 => format!("{} or more", 1u64 << (c - 1)),
        c => format!("{} to {}", 1u64 << (c - 1), (1u64 << c) - 1),
    }
}

/// The bucket of a latency.
fn bucket_of(took: Duration) -> usize {
    let us = took.as_secs_f64() * 1e6;
    if us <= 1.0 {
        0
    } else {
        ((us.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1)
    }
}

/// The quantile `q` of a histogram of `total` counts, as its bucket's upper bound.
fn hist_quantile(total: u64, q: f64, count_at: impl Fn(usize) -> u64) -> Duration {
    if total == 0 {
        return Duration::ZERO;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for i in 0..BUCKETS {
        seen += count_at(i);
        if seen >= rank {
            let upper_us = 2f64.powf((i + 1) as f64 / PER_OCTAVE);
            return Duration::from_secs_f64(upper_us / 1e6);
        }
    }
    Duration::MAX
}

/// Request outcomes of one model version: counts and a latency histogram per size class, fed
/// by the scheduler's observer.
pub struct Probe {
    buckets: Box<[AtomicU64]>,
    failed: AtomicU64,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            buckets: (0..CLASSES * BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            failed: AtomicU64::new(0),
        }
    }
}

impl Probe {
    /// Records one completed request of `elements` input elements.
    pub fn record(&self, ok: bool, took: Duration, elements: u64) {
        self.buckets[class_of(elements) * BUCKETS + bucket_of(took)]
            .fetch_add(1, Ordering::Relaxed);
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
            probe.record(t.ok, t.total, t.elements);
            if let Some(n) = &next {
                n(t);
            }
        })
    }
}

/// Request outcomes: totals and a latency histogram per size class (see [`Probe`]).
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

    fn at(&self, class: usize, bucket: usize) -> u64 {
        self.hist
            .get(class * BUCKETS + bucket)
            .copied()
            .unwrap_or(0)
    }

    /// The `q` quantile of latency over every size, as its bucket's upper bound (zero when
    /// empty).
    pub fn quantile(&self, q: f64) -> Duration {
        hist_quantile(self.total, q, |b| (0..CLASSES).map(|c| self.at(c, b)).sum())
    }

    /// Requests of size class `class`.
    fn class_total(&self, class: usize) -> u64 {
        (0..BUCKETS).map(|b| self.at(class, b)).sum()
    }

    /// The `q` quantile of latency of size class `class`.
    fn class_quantile(&self, class: usize, q: f64) -> Duration {
        hist_quantile(self.class_total(class), q, |b| self.at(class, b))
    }
}

/// A reload under watch: the version swapped in, the one it replaced (kept loaded), and what
/// the new version's probes had recorded at the swap.
pub(super) struct Watch {
    /// The entry to swap back in on a breach.
    pub good: Arc<ModelEntry>,
    /// The new versions' probes, with their readings at the swap.
    pub probes: Vec<(Arc<Probe>, Counts)>,
    /// What the previous version's probes had recorded at the swap (its whole history), to
    /// judge the new version's latency on requests of the same sizes.
    pub before: Counts,
    pub sla: Sla,
    pub started: Instant,
}

impl Watch {
    /// A watch of `candidate` (just swapped in) against `good`, when `candidate` declares an
    /// SLA.
    pub fn start(good: Arc<ModelEntry>, candidate: &ModelEntry) -> Option<Watch> {
        let mut before = Counts::default();
        for state in good.versions.values() {
            if let VersionState::Ready(m) = state {
                if let Some(p) = &m.probe {
                    before.add(&p.counts());
                }
            }
        }
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
            before,
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
        if let Some(why) = breach(&self.sla, &seen, &self.before) {
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
    /// New versions that passed their gate.
    pub gate_passed: u64,
    /// New versions kept out by their gate.
    pub gate_failed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_read_at_most_one_bucket_high() {
        let p = Probe::default();
        for ms in 1..=100 {
            p.record(true, Duration::from_millis(ms), 1);
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
        // The previous version: fast on 16-element requests.
        let old = Probe::default();
        for _ in 0..10 {
            old.record(true, Duration::from_millis(2), 16);
        }
        let before = old.counts();
        let p = Probe::default();
        let at_start = p.counts();
        for _ in 0..9 {
            p.record(true, Duration::from_millis(50), 16);
        }
        assert_eq!(
            breach(&sla, &p.counts().since(&at_start), &before),
            None,
            "too few"
        );
        p.record(true, Duration::from_millis(50), 16);
        let why = breach(&sla, &p.counts().since(&at_start), &before).unwrap();
        assert!(
            why.contains("p99 latency") && why.contains("16 to 31 input elements"),
            "{why}"
        );
        assert!(why.contains("previous version's p99 was 2.0 ms"), "{why}");

        let q = Probe::default();
        for i in 0..20 {
            q.record(i % 4 != 0, Duration::from_millis(1), 1);
        }
        let why = breach(&sla, &q.counts(), &Counts::default()).unwrap();
        assert!(why.contains("error rate 0.250"), "{why}");

        let fine = Probe::default();
        for i in 0..100 {
            fine.record(i != 0, Duration::from_millis(2), 16);
        }
        assert_eq!(breach(&sla, &fine.counts(), &before), None);
        // What was seen before the swap does not count.
        let at_swap = p.counts();
        for _ in 0..10 {
            p.record(true, Duration::from_millis(1), 16);
        }
        assert_eq!(breach(&sla, &p.counts().since(&at_swap), &before), None);
    }

    /// The attack the comparison stops: right after a swap, clients send requests far larger
    /// than the previous version ever served. They are slow on any version, so they say nothing
    /// of the new one; only like-sized requests are compared.
    #[test]
    fn large_requests_the_previous_version_never_served_cause_no_rollback() {
        let sla = Sla {
            p99: Some(Duration::from_millis(10)),
            max_error_rate: None,
            window: Duration::from_secs(60),
            min_requests: 10,
        };
        let old = Probe::default();
        for _ in 0..100 {
            old.record(true, Duration::from_millis(2), 16);
        }
        let new = Probe::default();
        for _ in 0..100 {
            new.record(true, Duration::from_millis(400), 1 << 20);
        }
        for _ in 0..50 {
            new.record(true, Duration::from_millis(2), 16);
        }
        assert_eq!(breach(&sla, &new.counts(), &old.counts()), None);
        // Nor with no history of the previous version at all.
        assert_eq!(breach(&sla, &new.counts(), &Counts::default()), None);
        // Like-sized requests where the previous version was just as slow: no regression.
        let slow_old = Probe::default();
        for _ in 0..100 {
            slow_old.record(true, Duration::from_millis(380), 1 << 20);
        }
        assert_eq!(breach(&sla, &new.counts(), &slow_old.counts()), None);
        // ... and where it was fast, a regression.
        let fast_old = Probe::default();
        for _ in 0..100 {
            fast_old.record(true, Duration::from_millis(5), 1 << 20);
        }
        let why = breach(&sla, &new.counts(), &fast_old.counts()).unwrap();
        assert!(why.contains("1048576 to 2097151 input elements"), "{why}");
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 1);
        assert_eq!((class_of(2), class_of(3), class_of(4)), (2, 2, 3));
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        assert_eq!(class_range(3), "4 to 7");
        assert_eq!(class_range(CLASSES - 1), "2147483648 or more");
    }
}
