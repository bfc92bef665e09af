//! A new version earns its place: before a version that declares a gate (`gate.*` parameters)
//! serves, it answers the model's held-out inputs (its `model_warmup` samples) side by side
//! with the version it replaces, and it serves only if its answers agree within the declared
//! bounds and its latency stays within the declared ratio.
//!
//! Which versions are judged, and against what:
//! - on a reload, each version that was not serving before, against `gate.baseline_version`
//!   when it is set, else the highest version that was serving;
//! - on a first load (nothing served before), each version other than `gate.baseline_version`
//!   against it; without one there is nothing to compare with and nothing is judged.
//!
//! The baseline is taken from this load when it selects it, else from what serves, else it is
//! loaded from its directory for the check. A version that fails becomes UNAVAILABLE with what
//! was measured; on a reload the previous version keeps serving, and on a first load a baseline
//! loaded for the check serves in its place (as it does for a version that did not load at
//! all: an engine refused it, say). A baseline that cannot be loaded fails the versions
//! it was to judge: the gate fails closed.
//!
//! Agreement is measured per output row (the last axis; a scalar is one row): the cosine of
//! the two rows, whether their arg-max agrees, and the largest absolute difference of any
//! element. BYTES outputs must be equal. Latency is each version's compute time (the
//! scheduler's input, infer and output time for the request, without queueing, so that the
//! serving version's live traffic does not count against it), its median over `gate.rounds`
//! runs per sample, summed over the samples; runs alternate between the two versions.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_core::config::params::{
    Gate, MAX_ABS_DIFF_KEY, MAX_LATENCY_RATIO_KEY, MIN_COSINE_KEY, MIN_TOP1_KEY,
};
use wisp_core::{InferRequest, Result, Tensor};

use super::entry::{ModelEntry, ModelVersion, VersionState};

/// How long one held-out sample may take on one version.
const CALL_LIMIT: Duration = Duration::from_secs(60);

/// What a version's gate measured against its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The version compared with.
    pub baseline: u64,
    /// Held-out samples run.
    pub samples: usize,
    /// Output rows compared.
    pub rows: usize,
    /// Lowest cosine of a row (1 when there were none).
    pub min_cosine: f64,
    /// Share of rows whose arg-max agreed (1 when there were none).
    pub top1: f64,
    /// Largest absolute difference of an element.
    pub max_abs_diff: f64,
    /// The new version's compute time: per sample the median of its runs, summed.
    pub new_time: Duration,
    /// The baseline's, measured the same way in the same runs.
    pub old_time: Duration,
    /// Each bound it broke, or what stopped the comparison; empty when it passed.
    pub failures: Vec<String>,
}

impl Report {
    /// Whether the version kept every bound.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// New compute time over old (1 when the old one took no measurable time).
    pub fn latency_ratio(&self) -> f64 {
        match self.old_time.as_nanos() {
            0 => 1.0,
            old => self.new_time.as_nanos() as f64 / old as f64,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "against version {} on {} held-out sample(s), {} output row(s): min cosine {:.4}, \
             top-1 agreement {:.3}, max abs diff {:.3e}, compute {:.0} µs vs {:.0} µs ({:.2}×)",
            self.baseline,
            self.samples,
            self.rows,
            self.min_cosine,
            self.top1,
            self.max_abs_diff,
            us(self.new_time),
            us(self.old_time),
            self.latency_ratio()
        )
    }
}

/// The outcome of one version's gate, for the registry's counts and the state directory.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The version judged.
    pub version: u64,
    /// What was measured.
    pub report: Arc<Report>,
}

/// The agreement of a new version's answers with the baseline's, accumulated over samples.
#[derive(Debug, Clone, PartialEq)]
struct Agreement {
    rows: usize,
    agreeing: usize,
    min_cosine: f64,
    max_abs_diff: f64,
}

impl Default for Agreement {
    fn default() -> Self {
        Agreement {
            rows: 0,
            agreeing: 0,
            min_cosine: 1.0,
            max_abs_diff: 0.0,
        }
    }
}

/// The lower of two figures, NaN winning (a NaN must fail a bound, never pass it).
fn lower(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// The higher of two figures, NaN winning.
fn higher(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

impl Agreement {
    /// Adds the comparison of one response's outputs (`new`) with the baseline's (`old`); a
    /// difference of kind (an output missing, another shape, BYTES that differ) is an error.
    fn add(&mut self, new: &[Tensor], old: &[Tensor]) -> std::result::Result<(), String> {
        for o in old {
            let n = new
                .iter()
                .find(|n| n.name == o.name)
                .ok_or_else(|| format!("output '{}' is missing", o.name))?;
            if n.shape != o.shape {
                return Err(format!(
                    "output '{}' has shape {:?}, the baseline's {:?}",
                    o.name, n.shape, o.shape
                ));
            }
            match (n.to_f64s(), o.to_f64s()) {
                (Some(a), Some(b)) => {
                    let width = match o.shape.last() {
                        Some(&w) if w > 0 => w as usize,
                        _ => a.len().max(1),
                    };
                    for (x, y) in a.chunks(width).zip(b.chunks(width)) {
                        self.row(x, y);
                    }
                }
                (None, None) => {
                    let (a, b) = (
                        n.strings().map_err(|e| e.to_string())?,
                        o.strings().map_err(|e| e.to_string())?,
                    );
                    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
                    if differ > 0 {
                        return Err(format!(
                            "output '{}': {differ} of {} strings differ from the baseline's",
                            o.name,
                            b.len()
                        ));
                    }
                }
                _ => {
                    return Err(format!(
                        "output '{}' is {}, the baseline's {}",
                        o.name, n.datatype, o.datatype
                    ))
                }
            }
        }
        Ok(())
    }

    fn row(&mut self, x: &[f64], y: &[f64]) {
        let (mut dot, mut xx, mut yy, mut diff) = (0.0, 0.0, 0.0, 0.0f64);
        for (&a, &b) in x.iter().zip(y) {
            dot += a * b;
            xx += a * a;
            yy += b * b;
            // Two NaNs agree (both versions failed the same way); one does not.
            let d = match (a.is_nan(), b.is_nan()) {
                (true, true) => 0.0,
                (false, false) if a == b => 0.0,
                _ => (a - b).abs(),
            };
            diff = higher(diff, if d.is_nan() { f64::INFINITY } else { d });
        }
        let cosine = match (xx == 0.0, yy == 0.0) {
            (true, true) => 1.0,
            (true, false) | (false, true) => 0.0,
            _ => dot / (xx.sqrt() * yy.sqrt()),
        };
        self.rows += 1;
        if argmax(x) == argmax(y) {
            self.agreeing += 1;
        }
        self.min_cosine = lower(self.min_cosine, cosine);
        self.max_abs_diff = higher(self.max_abs_diff, diff);
    }

    fn top1(&self) -> f64 {
        match self.rows {
            0 => 1.0,
            n => self.agreeing as f64 / n as f64,
        }
    }
}

/// The index of the first largest element (NaN never wins).
fn argmax(x: &[f64]) -> Option<usize> {
    x.iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .fold(None, |best: Option<(usize, f64)>, (i, &v)| match best {
            Some((_, b)) if b >= v => best,
            _ => Some((i, v)),
        })
        .map(|(i, _)| i)
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d.get(d.len() / 2).copied().unwrap_or_default()
}

/// The compute time a response reports (its wall time when it reports none).
fn compute_time(took: Duration, r: &wisp_core::InferResponse) -> Duration {
    match &r.compute {
        Some(t) => Duration::from_nanos(t.input_ns + t.infer_ns + t.output_ns),
        None => took,
    }
}

/// Runs `samples` on `new` and on `old` (version `baseline`), alternating, and judges `new`
/// against `gate`.
pub(crate) fn judge(
    gate: &Gate,
    samples: &[InferRequest],
    new: &ModelVersion,
    old: &ModelVersion,
) -> Report {
    let mut agreement = Agreement::default();
    let mut failures = Vec::new();
    let (mut new_time, mut old_time) = (Duration::ZERO, Duration::ZERO);
    'samples: for sample in samples {
        let (mut new_runs, mut old_runs) = (Vec::new(), Vec::new());
        for round in 0..gate.rounds {
            let run = |m: &ModelVersion| {
                let start = Instant::now();
                let r = m.infer_blocking(sample.clone(), start + CALL_LIMIT);
                r.map(|r| (compute_time(start.elapsed(), &r), r))
            };
            let (o, n) = match (run(old), run(new)) {
                (Ok(o), Ok(n)) => (o, n),
                (Err(e), _) => {
                    failures.push(format!(
                        "held-out sample '{}' failed on version {}: {e}",
                        sample.id, old.version
                    ));
                    break 'samples;
                }
                (_, Err(e)) => {
                    failures.push(format!("held-out sample '{}' failed: {e}", sample.id));
                    break 'samples;
                }
            };
            if round == 0 {
                if let Err(why) = agreement.add(&n.1.outputs, &o.1.outputs) {
                    failures.push(format!("held-out sample '{}': {why}", sample.id));
                    break 'samples;
                }
            }
            old_runs.push(o.0);
            new_runs.push(n.0);
        }
        old_time += median(old_runs);
        new_time += median(new_runs);
    }
    let mut report = Report {
        baseline: old.version,
        samples: samples.len(),
        rows: agreement.rows,
        min_cosine: agreement.min_cosine,
        top1: agreement.top1(),
        max_abs_diff: agreement.max_abs_diff,
        new_time,
        old_time,
        failures,
    };
    if report.failures.is_empty() {
        report.failures = broken_bounds(gate, &report);
    }
    report
}

/// `x ≥ bound`, false for a NaN.
fn at_least(x: f64, bound: f64) -> bool {
    matches!(
        x.partial_cmp(&bound),
        Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
    )
}

/// `x ≤ bound`, false for a NaN.
fn at_most(x: f64, bound: f64) -> bool {
    matches!(
        x.partial_cmp(&bound),
        Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
    )
}

/// Each bound of `gate` that `report` breaks, named by its parameter.
fn broken_bounds(gate: &Gate, report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    // A NaN figure breaks its bound.
    if let Some(min) = gate.min_cosine.filter(|&m| !at_least(report.min_cosine, m)) {
        out.push(format!(
            "min cosine {:.4} under {MIN_COSINE_KEY} {min}",
            report.min_cosine
        ));
    }
    if let Some(min) = gate.min_top1.filter(|&m| !at_least(report.top1, m)) {
        out.push(format!(
            "top-1 agreement {:.3} under {MIN_TOP1_KEY} {min}",
            report.top1
        ));
    }
    if let Some(max) = gate
        .max_abs_diff
        .filter(|&m| !at_most(report.max_abs_diff, m))
    {
        out.push(format!(
            "max abs diff {:.3e} over {MAX_ABS_DIFF_KEY} {max}",
            report.max_abs_diff
        ));
    }
    if let Some(max) = gate
        .max_latency_ratio
        .filter(|&m| !at_most(report.latency_ratio(), m))
    {
        out.push(format!(
            "compute time {:.2}× the baseline's, over {MAX_LATENCY_RATIO_KEY} {max}",
            report.latency_ratio()
        ));
    }
    out
}

/// Judges the versions of one load that `gate` covers (see the module's rules) and keeps out
/// those that fail: `loaded` holds this load's versions; `previous` what served before it;
/// `load_baseline` loads a version from the repository for the check. Returns the outcome of
/// each version judged.
pub(crate) fn apply(
    model: &str,
    gate: &Gate,
    samples: &[InferRequest],
    loaded: &mut BTreeMap<u64, Result<ModelVersion>>,
    previous: Option<&ModelEntry>,
    load_baseline: impl FnOnce(u64) -> Result<ModelVersion>,
) -> Vec<Outcome> {
    let ready = |e: &ModelEntry| -> BTreeMap<u64, Arc<ModelVersion>> {
        e.versions
            .iter()
            .filter_map(|(v, s)| match s {
                VersionState::Ready(m) => Some((*v, m.clone())),
                VersionState::Unavailable(_) => None,
            })
            .collect()
    };
    let served = previous
        .filter(|p| p.is_ready())
        .map(ready)
        .unwrap_or_default();
    let Some(baseline) = gate.baseline.or_else(|| served.keys().last().copied()) else {
        return Vec::new();
    };
    let judged: Vec<u64> = loaded
        .iter()
        .filter(|(v, m)| m.is_ok() && **v != baseline && !served.contains_key(v))
        .map(|(v, _)| *v)
        .collect();
    // On a first load, a declared baseline also stands in for a version that did not load.
    let first_load = served.is_empty();
    let unloaded = first_load && loaded.iter().any(|(v, m)| m.is_err() && *v != baseline);
    if judged.is_empty() && !unloaded {
        return Vec::new();
    }
    // The baseline: from this load, else what serves, else its files.
    enum Base {
        Here,
        Served(Arc<ModelVersion>),
        Loaded(Box<ModelVersion>),
    }
    let base = if loaded.get(&baseline).is_some_and(|m| m.is_ok()) {
        Ok(Base::Here)
    } else if let Some(m) = served.get(&baseline) {
        Ok(Base::Served(m.clone()))
    } else {
        load_baseline(baseline).map(|m| Base::Loaded(Box::new(m)))
    };
    let mut outcomes = Vec::new();
    let mut any_failed = false;
    for v in judged {
        let report = match &base {
            Err(e) => Report {
                baseline,
                samples: 0,
                rows: 0,
                min_cosine: f64::NAN,
                top1: f64::NAN,
                max_abs_diff: f64::NAN,
                new_time: Duration::ZERO,
                old_time: Duration::ZERO,
                failures: vec![format!(
                    "the baseline version {baseline} cannot be loaded: {e}"
                )],
            },
            Ok(b) => {
                let old = match b {
                    Base::Here => match loaded.get(&baseline) {
                        Some(Ok(m)) => m,
                        _ => unreachable!("checked above"),
                    },
                    Base::Served(m) => m.as_ref(),
                    Base::Loaded(m) => m,
                };
                let Some(Ok(new)) = loaded.get(&v) else {
                    continue;
                };
                judge(gate, samples, new, old)
            }
        };
        let report = Arc::new(report);
        if report.passed() {
            tracing::info!(model, version = v, report = %report, "new version passed its gate");
            if let Some(Ok(m)) = loaded.get_mut(&v) {
                m.gate = Some(report.clone());
            }
        } else {
            tracing::error!(model, version = v, report = %report, failures = ?report.failures, "new version failed its gate; it does not serve");
            any_failed = true;
            loaded.insert(v, Err(wisp_core::Error::invalid(failure_reason(&report))));
        }
        outcomes.push(Outcome { version: v, report });
    }
    // On a first load, a baseline loaded for the check serves in place of what failed its
    // gate or did not load.
    match base {
        Ok(Base::Loaded(m)) if first_load && (any_failed || unloaded) => {
            tracing::warn!(
                model,
                version = baseline,
                "the gate's baseline serves in place of versions that failed their gate or did not load"
            );
            loaded.insert(baseline, Ok(*m));
        }
        Err(e) if unloaded => {
            tracing::error!(model, version = baseline, error = %e, "the gate's baseline cannot be loaded either");
        }
        _ => {}
    }
    outcomes
}

/// Why a version that failed its gate is not serving, as the repository index shows it.
pub fn failure_reason(report: &Report) -> String {
    format!(
        "failed its gate: {}; measured {report}",
        report.failures.join("; ")
    )
}

#[cfg(test)]
mod tests;
