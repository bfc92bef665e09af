//! The scheduling policy of one model version, derived from its config with Triton's defaults.

use std::time::Duration;

use wisp_core::config::sequence::SequenceBatching;
use wisp_core::config::{ModelConfig, QueuePolicy};

pub use wisp_core::config::TimeoutAction;

/// Queue policy of one priority level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelPolicy {
    /// On timeout.
    pub action: TimeoutAction,
    /// Timeout of requests that give none.
    pub default_timeout: Option<Duration>,
    /// Requests may lower the timeout with their `timeout` parameter.
    pub allow_override: bool,
    /// Bound on queued requests at this level (0 = none).
    pub max_queue_size: usize,
}

impl Default for LevelPolicy {
    fn default() -> Self {
        LevelPolicy {
            action: TimeoutAction::Reject,
            default_timeout: None,
            allow_override: false,
            max_queue_size: 0,
        }
    }
}

impl From<&QueuePolicy> for LevelPolicy {
    fn from(p: &QueuePolicy) -> Self {
        LevelPolicy {
            action: p.timeout_action,
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_override: p.allow_timeout_override,
            max_queue_size: p.max_queue_size as usize,
        }
    }
}

/// How a model version's requests are queued and batched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Largest batch in rows (0: the model does not batch; each request runs alone).
    pub max_batch_size: usize,
    /// The dynamic batcher is on: requests are grouped into batches.
    pub dynamic: bool,
    /// Batch sizes dispatched as soon as formed.
    pub preferred: Vec<usize>,
    /// How long the oldest queued request may wait for a fuller batch.
    pub max_queue_delay: Duration,
    /// Responses in request order.
    pub preserve_ordering: bool,
    /// Level of requests without a priority (1-based).
    pub default_level: usize,
    /// One policy per level, index 0 = level 1 (highest).
    pub levels: Vec<LevelPolicy>,
}

impl Policy {
    /// Triton's semantics from the model config and its `sequence_batching` (as
    /// [`ModelSpec::sequence`](wisp_core::config::ModelSpec::sequence) holds it), whose
    /// strategy replaces `dynamic_batching` when set.
    pub fn from_config(cfg: &ModelConfig, sequence: Option<&SequenceBatching>) -> Self {
        let max_batch_size = cfg.max_batch_size.max(0) as usize;
        if let Some(seq) = sequence {
            // Each sequence has one request in flight at a time, so a batch holds one request
            // per sequence: the sequences of one instance batch together.
            use wisp_core::config::sequence::Strategy;
            let (preferred, delay, ordered) = match &seq.strategy {
                Strategy::Direct { max_queue_delay } => (Vec::new(), *max_queue_delay, false),
                Strategy::Oldest {
                    preferred,
                    max_queue_delay,
                    preserve_ordering,
                    ..
                } => (preferred.clone(), *max_queue_delay, *preserve_ordering),
            };
            return Policy {
                max_batch_size,
                dynamic: max_batch_size > 0,
                preferred,
                max_queue_delay: delay,
                preserve_ordering: ordered,
                default_level: 1,
                levels: vec![LevelPolicy::default()],
            };
        }
        match &cfg.dynamic_batching {
            None => Policy {
                max_batch_size,
                dynamic: false,
                preferred: Vec::new(),
                max_queue_delay: Duration::ZERO,
                preserve_ordering: false,
                default_level: 1,
                levels: vec![LevelPolicy::default()],
            },
            Some(db) => {
                let n = db.priority_levels.max(1) as usize;
                let default = db
                    .default_queue_policy
                    .as_ref()
                    .map(LevelPolicy::from)
                    .unwrap_or_default();
                let levels = (1..=n as u64)
                    .map(|l| {
                        db.priority_queue_policy
                            .get(&l)
                            .map(LevelPolicy::from)
                            .unwrap_or_else(|| default.clone())
                    })
                    .collect();
                let mut preferred: Vec<usize> = db
                    .preferred_batch_size
                    .iter()
                    .map(|&p| p.max(1) as usize)
                    .collect();
                preferred.sort_unstable();
                Policy {
                    max_batch_size,
                    dynamic: max_batch_size > 0,
                    preferred,
                    max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
                    preserve_ordering: db.preserve_ordering,
                    default_level: (db.default_priority_level as usize).clamp(1, n),
                    levels,
                }
            }
        }
    }

    /// The level (1-based) for a request's `priority` parameter (0 or out of range: default).
    pub fn level_for(&self, priority: u64) -> usize {
        if priority >= 1 && priority as usize <= self.levels.len() {
            priority as usize
        } else {
            self.default_level
        }
    }

    /// The queue timeout of a request at `level` that asked for `requested` µs (0 = none).
    pub fn timeout_for(&self, level: usize, requested: u64) -> Option<Duration> {
        let p = &self.levels[level - 1];
        let asked = (requested > 0).then(|| Duration::from_micros(requested));
        match (p.default_timeout, asked, p.allow_override) {
            (d, Some(a), true) => Some(d.map_or(a, |d| d.min(a))),
            (d, _, _) => d,
        }
    }
}
