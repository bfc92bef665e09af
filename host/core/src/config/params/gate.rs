//! A version's gate (`gate.*`): the bounds a new version's answers and latency must keep,
//! measured against the version it replaces, before it serves.
//!
//! | key | meaning | bounds |
//! |---|---|---|
//! | `gate.min_cosine` | every output row's cosine with the old version's | [-1, 1] |
//! | `gate.min_top1` | share of output rows whose arg-max agrees | [0, 1] |
//! | `gate.max_abs_diff` | largest element difference | finite, ≥ 0 |
//! | `gate.max_latency_ratio` | new median latency / old median latency | (0, 1000] |
//! | `gate.baseline_version` | the version compared with when no other serves before it | 1 ..= 2^63 |
//! | `gate.rounds` | timed runs of each sample on each version (default 5) | 1 ..= 100 |
//!
//! A model has a gate when it sets one of the four bounds. The held-out inputs are its
//! `model_warmup` samples, so a gate without one is refused, as is a gate on a decoupled or
//! stateful model (their answers are not one response per request).

use super::{bad, ConfigError, ModelConfig};

/// The cosine bound's key.
pub const MIN_COSINE_KEY: &str = "gate.min_cosine";
/// The top-1 agreement bound's key.
pub const MIN_TOP1_KEY: &str = "gate.min_top1";
/// The absolute difference bound's key.
pub const MAX_ABS_DIFF_KEY: &str = "gate.max_abs_diff";
/// The latency ratio bound's key.
pub const MAX_LATENCY_RATIO_KEY: &str = "gate.max_latency_ratio";
/// The baseline version's key.
pub const BASELINE_KEY: &str = "gate.baseline_version";
/// The timed rounds' key.
pub const ROUNDS_KEY: &str = "gate.rounds";

const DEFAULT_ROUNDS: u32 = 5;
const MAX_ROUNDS: u32 = 100;

/// What a new version must keep against the version it replaces.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// Lowest cosine of any output row with the old version's row.
    pub min_cosine: Option<f64>,
    /// Lowest share of rows whose arg-max agrees.
    pub min_top1: Option<f64>,
    /// Largest absolute difference of any element.
    pub max_abs_diff: Option<f64>,
    /// Largest ratio of the new version's median latency to the old one's.
    pub max_latency_ratio: Option<f64>,
    /// The version to compare with when none served before this load (a first start).
    pub baseline: Option<u64>,
    /// Timed runs of each sample on each version.
    pub rounds: u32,
}

impl Gate {
    /// The gate `cfg` declares: `Ok(None)` when it declares none, an error naming the
    /// parameter when a value is malformed or out of bounds, or when the model cannot be gated.
    pub fn of(cfg: &ModelConfig) -> Result<Option<Gate>, ConfigError> {
        let param = |key: &str| cfg.parameter_set(key);
        let number = |key: &str, ok: &dyn Fn(f64) -> bool, why: &str| match param(key) {
            None => Ok(None),
            Some(v) => match v.parse::<f64>() {
                Ok(x) if x.is_finite() && ok(x) => Ok(Some(x)),
                _ => Err(bad(key, format!("{why}, not '{v}'"))),
            },
        };
        let min_cosine = number(
            MIN_COSINE_KEY,
            &|x| (-1.0..=1.0).contains(&x),
            "must be a cosine in [-1, 1]",
        )?;
        let min_top1 = number(
            MIN_TOP1_KEY,
            &|x| (0.0..=1.0).contains(&x),
            "must be a fraction in [0, 1]",
        )?;
        let max_abs_diff = number(MAX_ABS_DIFF_KEY, &|x| x >= 0.0, "must be a number ≥ 0")?;
        let max_latency_ratio = number(
            MAX_LATENCY_RATIO_KEY,
            &|x| x > 0.0 && x <= 1000.0,
            "must be a ratio in (0, 1000]",
        )?;
        let baseline = match param(BASELINE_KEY) {
            None => None,
            Some(v) => match v.parse::<u64>() {
                Ok(n) if (1..=i64::MAX as u64).contains(&n) => Some(n),
                _ => {
                    return Err(bad(
                        BASELINE_KEY,
                        format!("must be a version ≥ 1, not '{v}'"),
                    ))
                }
            },
        };
        let rounds = match param(ROUNDS_KEY) {
            None => DEFAULT_ROUNDS,
            Some(v) => match v.parse::<u32>() {
                Ok(n @ 1..=MAX_ROUNDS) => n,
                _ => {
                    return Err(bad(
                        ROUNDS_KEY,
                        format!("must be a count in 1..={MAX_ROUNDS}, not '{v}'"),
                    ))
                }
            },
        };
        let bounds = [
            MIN_COSINE_KEY,
            MIN_TOP1_KEY,
            MAX_ABS_DIFF_KEY,
            MAX_LATENCY_RATIO_KEY,
        ];
        let Some(first) = bounds.iter().find(|k| param(k).is_some()) else {
            if let Some(key) = [BASELINE_KEY, ROUNDS_KEY]
                .into_iter()
                .find(|k| param(k).is_some())
            {
                return Err(bad(key, format!("needs one of {}", bounds.join(", "))));
            }
            return Ok(None);
        };
        if cfg.model_warmup.is_empty() {
            return Err(bad(
                first,
                "needs held-out inputs: at least one model_warmup sample".into(),
            ));
        }
        if cfg.decoupled() || cfg.other.contains_key(crate::config::sequence::FIELD) {
            return Err(bad(
                first,
                "a decoupled or stateful model cannot be gated: its answers are not one response per request"
                    .into(),
            ));
        }
        Ok(Some(Gate {
            min_cosine,
            min_top1,
            max_abs_diff,
            max_latency_ratio,
            baseline,
            rounds,
        }))
    }
}
