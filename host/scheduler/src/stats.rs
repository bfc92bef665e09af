//! Per-model-version statistics in the shape of Triton's statistics extension. Lock-free
//! counters, except the per-batch-size table. Metrics are derived from the same numbers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A `{count, ns}` statistic.
#[derive(Debug, Default)]
pub struct DurationStat {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationStat {
    /// Adds one observation.
    pub fn add(&self, d: Duration) {
        self.add_n(1, d.as_nanos() as u64);
    }
    /// Adds `count` observations totalling `ns`.
    pub fn add_n(&self, count: u64, ns: u64) {
        self.count.fetch_add(count, Relaxed);
        self.ns.fetch_add(ns, Relaxed);
    }
    /// (count, ns).
    pub fn get(&self) -> (u64, u64) {
        (self.count.load(Relaxed), self.ns.load(Relaxed))
    }
}

/// Why a request failed, as Triton's `nv_inference_request_failure{reason}` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// Refused by the queue (full, timed out, stopping).
    Rejected,
    /// Cancelled by the client.
    Canceled,
    /// The backend failed.
    Backend,
    /// Anything else.
    Other,
}

impl FailReason {
    /// All reasons, in label order.
    pub const ALL: [FailReason; 4] = [
        FailReason::Rejected,
        FailReason::Canceled,
        FailReason::Backend,
        FailReason::Other,
    ];
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            FailReason::Rejected => "REJECTED",
            FailReason::Canceled => "CANCELED",
            FailReason::Backend => "BACKEND",
            FailReason::Other => "OTHER",
        }
    }
}

/// Compute time of the executions of one batch size.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchStat {
    /// Executions.
    pub count: u64,
    /// Summed compute_input ns.
    pub input_ns: u64,
    /// Summed compute_infer ns.
    pub infer_ns: u64,
    /// Summed compute_output ns.
    pub output_ns: u64,
}

/// Statistics of one model version.
#[derive(Debug, Default)]
pub struct ModelStats {
    /// Successful requests, end-to-end time.
    pub success: DurationStat,
    /// Failed requests, end-to-end time.
    pub fail: DurationStat,
    /// Time successful requests spent queued.
    pub queue: DurationStat,
    /// Batch input preparation, attributed to each request of the batch.
    pub compute_input: DurationStat,
    /// Model execution, attributed to each request of the batch.
    pub compute_infer: DurationStat,
    /// Output handling, attributed to each request of the batch.
    pub compute_output: DurationStat,
    /// Response-cache hits (lookup time).
    pub cache_hit: DurationStat,
    /// Response-cache misses (lookup + insert time).
    pub cache_miss: DurationStat,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    failures: [AtomicU64; 4],
    batches: Mutex<BTreeMap<usize, BatchStat>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ModelStats {
    /// Records one executed batch of `rows` rows for `requests` successful requests.
    pub fn record_execution(&self, rows: usize, requests: u64, t: wisp_core::backend::ExecTiming) {
        self.execution_count.fetch_add(1, Relaxed);
        self.inference_count.fetch_add(rows as u64, Relaxed);
        self.last_inference_ms.store(now_ms(), Relaxed);
        self.compute_input.add_n(requests, t.input_ns * requests);
        self.compute_infer.add_n(requests, t.infer_ns * requests);
        self.compute_output.add_n(requests, t.output_ns * requests);
        let mut b = self.batches.lock().expect("batch stats lock");
        let e = b.entry(rows).or_default();
        e.count += 1;
        e.input_ns += t.input_ns;
        e.infer_ns += t.infer_ns;
        e.output_ns += t.output_ns;
    }

    /// Records a failed request.
    pub fn record_failure(&self, reason: FailReason, total: Duration) {
        self.fail.add(total);
        self.failures[reason as usize].fetch_add(1, Relaxed);
        self.last_inference_ms.store(now_ms(), Relaxed);
    }

    /// Records a request answered from the response cache.
    pub fn record_cache_hit(&self, lookup: Duration, total: Duration) {
        self.cache_hit.add(lookup);
        self.success.add(total);
        self.last_inference_ms.store(now_ms(), Relaxed);
    }

    /// Failures by reason.
    pub fn failures(&self, reason: FailReason) -> u64 {
        self.failures[reason as usize].load(Relaxed)
    }
    /// Inferences (batch rows) executed.
    pub fn inference_count(&self) -> u64 {
        self.inference_count.load(Relaxed)
    }
    /// Batches executed.
    pub fn execution_count(&self) -> u64 {
        self.execution_count.load(Relaxed)
    }
    /// Time of the last request, ms since the epoch (0: none yet).
    pub fn last_inference_ms(&self) -> u64 {
        self.last_inference_ms.load(Relaxed)
    }
    /// Per batch size.
    pub fn batch_stats(&self) -> BTreeMap<usize, BatchStat> {
        self.batches.lock().expect("batch stats lock").clone()
    }
}
