//! Triton's time-to-first-response histogram (`nv_inference_first_response_histogram_ms`) of
//! a decoupled model version: from the request's arrival to the first part its stream sends
//! (a response, an error or the final flag alone). Counted with atomics on the streaming path;
//! the metrics front end renders it, cumulative as Prometheus wants, when
//! `--metrics-config histogram_latencies=true`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One version's histogram.
#[derive(Debug)]
pub struct FirstResponse {
    /// Upper bounds in milliseconds, strictly increasing (checked when the config was read).
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last is `+Inf`'s own.
    counts: Vec<AtomicU64>,
    /// Sum of the observations, in microseconds.
    sum_us: AtomicU64,
}

/// A histogram as read at one moment: cumulative counts per upper bound, then the total.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// `(le, observations ≤ le)`, in order; `+Inf` is [`Snapshot::count`].
    pub buckets: Vec<(f64, u64)>,
    /// Every observation.
    pub count: u64,
    /// Their sum, in milliseconds.
    pub sum_ms: f64,
}

impl FirstResponse {
    /// A histogram with `bounds` (milliseconds, strictly increasing).
    pub fn new(bounds: Vec<f64>) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        FirstResponse {
            bounds,
            counts,
            sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one first response, `elapsed` after its request arrived.
    pub fn observe(&self, elapsed: Duration) {
        let ms = elapsed.as_secs_f64() * 1e3;
        let bucket = self.bounds.partition_point(|&le| le < ms);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> Snapshot {
        let mut running = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (le, c) in self.bounds.iter().zip(&self.counts) {
            running += c.load(Ordering::Relaxed);
            buckets.push((*le, running));
        }
        let count = running + self.counts[self.bounds.len()].load(Ordering::Relaxed);
        Snapshot {
            buckets,
            count,
            sum_ms: self.sum_us.load(Ordering::Relaxed) as f64 / 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_fall_in_the_first_bucket_that_holds_them() {
        let h = FirstResponse::new(vec![-1.0, 0.0, 1.0, 2.5]);
        for ms in [0.0, 0.5, 1.0, 2.0, 3.0, 3000.0] {
            h.observe(Duration::from_secs_f64(ms / 1e3));
        }
        let s = h.snapshot();
        // le is inclusive, as in Prometheus: 1.0 ms counts under le="1".
        assert_eq!(
            s.buckets,
            [(-1.0, 0), (0.0, 1), (1.0, 3), (2.5, 4)],
            "cumulative"
        );
        assert_eq!(s.count, 6);
        assert!((s.sum_ms - 3006.5).abs() < 1e-6, "{}", s.sum_ms);
    }
}
