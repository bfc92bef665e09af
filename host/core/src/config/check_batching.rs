//! Checking `dynamic_batching` and `model_warmup` (part of [`super::validate`]).

use std::path::Path;

use super::*;

/// `dynamic_batching`: preferred sizes, priority levels, delays and queue policies.
pub(super) fn check_dynamic_batching(
    cfg: &ModelConfig,
    db: &DynamicBatching,
    err: &mut impl FnMut(String, String),
) {
    if cfg.max_batch_size == 0 && !db.preferred_batch_size.is_empty() {
        err(
            "dynamic_batching.preferred_batch_size".into(),
            "needs max_batch_size >= 1".into(),
        );
    }
    for &p in &db.preferred_batch_size {
        if p < 1 || (cfg.max_batch_size > 0 && p > cfg.max_batch_size) {
            err(
                "dynamic_batching.preferred_batch_size".into(),
                format!("{p} is outside 1..={}", cfg.max_batch_size),
            );
        }
    }
    if db.priority_levels > bounds::MAX_PRIORITY_LEVELS {
        err(
            "dynamic_batching.priority_levels".into(),
            format!(
                "must be in 0..={}, got {}",
                bounds::MAX_PRIORITY_LEVELS,
                db.priority_levels
            ),
        );
    }
    if db.max_queue_delay_microseconds > bounds::MAX_QUEUE_DELAY_US {
        err(
            "dynamic_batching.max_queue_delay_microseconds".into(),
            format!(
                "must be at most {}, got {}",
                bounds::MAX_QUEUE_DELAY_US,
                db.max_queue_delay_microseconds
            ),
        );
    }
    let levels = db.priority_levels.clamp(1, bounds::MAX_PRIORITY_LEVELS);
    if db.priority_levels > 0
        && (db.default_priority_level < 1 || db.default_priority_level > levels)
    {
        err(
            "dynamic_batching.default_priority_level".into(),
            format!("must be in 1..={levels}, got {}", db.default_priority_level),
        );
    }
    let policies = db
        .default_queue_policy
        .iter()
        .map(|p| ("dynamic_batching.default_queue_policy".to_string(), p))
        .chain(
            db.priority_queue_policy
                .iter()
                .map(|(l, p)| (format!("dynamic_batching.priority_queue_policy[{l}]"), p)),
        );
    for (path, p) in policies {
        if p.default_timeout_microseconds > bounds::MAX_TIMEOUT_US {
            err(
                format!("{path}.default_timeout_microseconds"),
                format!(
                    "must be at most {}, got {}",
                    bounds::MAX_TIMEOUT_US,
                    p.default_timeout_microseconds
                ),
            );
        }
        if p.max_queue_size > bounds::MAX_QUEUE_SIZE {
            err(
                format!("{path}.max_queue_size"),
                format!(
                    "must be at most {}, got {}",
                    bounds::MAX_QUEUE_SIZE,
                    p.max_queue_size
                ),
            );
        }
    }
    for l in db.priority_queue_policy.keys() {
        if *l < 1 || *l > levels {
            err(
                format!("dynamic_batching.priority_queue_policy[{l}]"),
                format!("level {l} is outside 1..={levels}"),
            );
        }
    }
}

/// `model_warmup[]`: bounded samples, batch sizes, inputs and their files.
pub(super) fn check_warmup(
    cfg: &ModelConfig,
    model_dir: &Path,
    err: &mut impl FnMut(String, String),
) {
    if cfg.model_warmup.len() > bounds::MAX_WARMUP_SAMPLES {
        err(
            "model_warmup".into(),
            format!(
                "at most {} samples, got {}",
                bounds::MAX_WARMUP_SAMPLES,
                cfg.model_warmup.len()
            ),
        );
    }
    for (i, w) in cfg.model_warmup.iter().enumerate() {
        let p = format!("model_warmup[{i}]");
        if w.count > bounds::MAX_WARMUP_COUNT {
            err(
                format!("{p}.count"),
                format!(
                    "must be at most {}, got {}",
                    bounds::MAX_WARMUP_COUNT,
                    w.count
                ),
            );
        }
        if w.batch_size < 1 || (cfg.max_batch_size == 0 && w.batch_size != 1) {
            err(
                format!("{p}.batch_size"),
                format!(
                    "must be >= 1 (and 1 when the model does not batch), got {}",
                    w.batch_size
                ),
            );
        } else if cfg.max_batch_size > 0 && w.batch_size as i32 > cfg.max_batch_size {
            err(
                format!("{p}.batch_size"),
                format!(
                    "{} exceeds max_batch_size {}",
                    w.batch_size, cfg.max_batch_size
                ),
            );
        }
        for (name, input) in &w.inputs {
            if !cfg.input.iter().any(|c| &c.name == name) {
                err(
                    format!("{p}.inputs[{name}]"),
                    "is not an input of the model".into(),
                );
            }
            let sources = [
                input.zero_data.is_some(),
                input.random_data.is_some(),
                input.input_data_file.is_some(),
            ];
            if sources.iter().filter(|s| **s).count() != 1 {
                err(
                    format!("{p}.inputs[{name}]"),
                    "needs exactly one of zero_data, random_data, input_data_file".into(),
                );
            }
            if let Some(f) = &input.input_data_file {
                match crate::repository::confine(&model_dir.join("warmup"), f) {
                    Err(why) => err(format!("{p}.inputs[{name}].input_data_file"), why),
                    Ok(path) if !path.is_file() => err(
                        format!("{p}.inputs[{name}].input_data_file"),
                        format!("file 'warmup/{f}' not found in the model directory"),
                    ),
                    Ok(_) => {}
                }
            }
            let declared = cfg.input.iter().find(|c| &c.name == name);
            let dims = match (input.dims.is_empty(), declared) {
                (false, _) => &input.dims[..],
                (true, Some(c)) => &c.dims[..],
                (true, None) => &[][..],
            };
            let data_type = input.data_type.or(declared.and_then(|c| c.data_type));
            // Unknown or BYTES elements count 4 bytes each (BYTES' length prefix).
            let elem = data_type.and_then(DataType::size).unwrap_or(4) as u64;
            let bytes = dims
                .iter()
                .try_fold(u64::from(w.batch_size.max(1)) * elem, |acc, &d| {
                    u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
                });
            match bytes {
                _ if dims.iter().any(|&d| d < 0) => {}
                Some(b) if b <= bounds::MAX_WARMUP_BYTES => {}
                _ => err(
                    format!("{p}.inputs[{name}].dims"),
                    format!(
                        "a warm-up input of {dims:?} (batch {}) is larger than the maximum of {} bytes",
                        w.batch_size,
                        bounds::MAX_WARMUP_BYTES
                    ),
                ),
            }
        }
    }
}
