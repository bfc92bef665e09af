//! Checking a normalized config ([`validate`]): every problem is reported at once with its
//! field path, one function per section of the config.

use std::path::Path;
use std::sync::Arc;

use super::check_batching::{check_dynamic_batching, check_warmup};
use super::*;

/// Checks a normalized config, reporting every problem found; a config that passes comes back
/// as its [`ModelSpec`].
pub fn validate(
    cfg: ModelConfig,
    dir_name: &str,
    model_dir: &Path,
) -> Result<ModelSpec, ConfigErrors> {
    let (steps, sequence, params, signature) = check(&cfg, dir_name, model_dir)?;
    Ok(ModelSpec {
        config: Arc::new(cfg),
        steps: steps.into(),
        sequence,
        params: Arc::new(params),
        signature: Arc::new(signature),
        file_sha256: None,
    })
}

type Checked = (
    Vec<ensemble::EnsembleStep>,
    Option<sequence::SequenceBatching>,
    params::Params,
    Signature,
);

fn check(cfg: &ModelConfig, dir_name: &str, model_dir: &Path) -> Result<Checked, ConfigErrors> {
    let mut errs = Vec::new();
    let mut err = |path: String, message: String| errs.push(ConfigError { path, message });
    let wasm = cfg.is_wasm() && cfg.platform.is_empty();
    let (steps, sequence) = check_kind(cfg, dir_name, &mut err);
    check_limits(cfg, model_dir, &mut err);
    let mut param_errs = Vec::new();
    let params = params::read(cfg, model_dir, wasm, &mut param_errs);
    for e in param_errs {
        err(e.path, e.message);
    }
    check_tensors(cfg, model_dir, &mut err);
    check_instances(cfg, &mut err);
    if let Some(db) = &cfg.dynamic_batching {
        check_dynamic_batching(cfg, db, &mut err);
    }
    check_warmup(cfg, model_dir, &mut err);
    // `check_tensor` refused every tensor without a datatype, and `max_batch_size` was bounded,
    // so a config with no errors has a signature.
    let signature = errs.is_empty().then(|| Signature::of(cfg));
    match signature {
        Some(Ok(signature)) => Ok((steps, sequence, params, signature)),
        Some(Err(e)) => Err(ConfigErrors {
            model: dir_name.to_string(),
            errors: vec![e],
        }),
        None => Err(ConfigErrors {
            model: dir_name.to_string(),
            errors: errs,
        }),
    }
}

/// The model's name and kind: an ensemble's steps and DAG, sequence batching, and a
/// platform or backend Wisp serves.
fn check_kind(
    cfg: &ModelConfig,
    dir_name: &str,
    err: &mut impl FnMut(String, String),
) -> (
    Vec<ensemble::EnsembleStep>,
    Option<sequence::SequenceBatching>,
) {
    let mut steps = Vec::new();
    if cfg.name != dir_name {
        err(
            "name".into(),
            format!(
                "'{}' does not match the model directory name '{dir_name}'",
                cfg.name
            ),
        );
    }
    let wasm = cfg.is_wasm() && cfg.platform.is_empty();
    let ensemble = cfg.is_ensemble() && cfg.backend.is_empty();
    if ensemble && !cfg.other.contains_key(ensemble::FIELD) {
        err(
            ensemble::FIELD.into(),
            "an ensemble needs ensemble_scheduling { step [ ... ] }".into(),
        );
    } else if ensemble {
        // The steps and the DAG they form, with the config's other errors.
        let problems = match ensemble::steps(cfg) {
            Ok(read) => {
                let names = |io: &mut dyn Iterator<Item = &String>| io.cloned().collect::<Vec<_>>();
                steps = read;
                ensemble::check_dag(
                    &names(&mut cfg.input.iter().map(|i| &i.name)),
                    &names(&mut cfg.output.iter().map(|o| &o.name)),
                    &steps,
                )
            }
            Err(problems) => problems,
        };
        for p in problems {
            err(ensemble::FIELD.into(), p);
        }
        if let Err(p) = ensemble::max_inflight_requests(cfg) {
            err(ensemble::FIELD.into(), p);
        }
    }
    if let Err(p) = super::metrics::read(cfg) {
        err(super::metrics::FIELD.into(), p);
    }
    let sequence = match sequence::read(cfg) {
        Ok(seq) => seq,
        Err(problems) => {
            for p in problems {
                err(sequence::FIELD.into(), p);
            }
            None
        }
    };
    if cfg.other.contains_key(sequence::FIELD) && ensemble {
        err(
            sequence::FIELD.into(),
            "an ensemble passes its sequence flags to its steps; it has no sequence batcher of its own".into(),
        );
    }
    if !(cfg.is_onnx() || wasm || ensemble) {
        let what = if cfg.platform.is_empty() && cfg.backend.is_empty() {
            "neither platform nor backend is set and no <version>/model.onnx or model.wasm was found".to_string()
        } else {
            format!(
                "unsupported platform '{}' / backend '{}', expected platform \"{ONNX_PLATFORM}\" or \"{ENSEMBLE_PLATFORM}\", or backend \"{ONNX_BACKEND}\" or \"{WASM_BACKEND}\"",
                cfg.platform, cfg.backend
            )
        };
        err("backend".into(), what);
    }
    if cfg.decoupled() && !wasm {
        err(
            super::TRANSACTION_POLICY.into(),
            "only wasm plugins can be decoupled (they send their responses through wisp:plugin/responses, 0.3.0); ONNX models and ensembles answer each request once".into(),
        );
    }
    if cfg.decoupled() && cfg.response_cache.as_ref().is_some_and(|c| c.enable) {
        err(
            "response_cache".into(),
            "the response cache does not support models with a decoupled transaction policy".into(),
        );
    }
    (steps, sequence)
}

/// Bounds on the batch size, the number of tensors and versions, and the model file's name.
fn check_limits(cfg: &ModelConfig, model_dir: &Path, err: &mut impl FnMut(String, String)) {
    if cfg.max_batch_size < 0 || cfg.max_batch_size > bounds::MAX_BATCH_SIZE {
        err(
            "max_batch_size".into(),
            format!(
                "must be in 0..={}, got {}",
                bounds::MAX_BATCH_SIZE,
                cfg.max_batch_size
            ),
        );
    }
    if let Err(why) = check_model_filename(&cfg.default_model_filename, model_dir) {
        err("default_model_filename".into(), why);
    }
    if cfg.input.len() > bounds::MAX_TENSORS {
        err(
            "input".into(),
            format!(
                "at most {} inputs, got {}",
                bounds::MAX_TENSORS,
                cfg.input.len()
            ),
        );
    }
    if cfg.output.len() > bounds::MAX_TENSORS {
        err(
            "output".into(),
            format!(
                "at most {} outputs, got {}",
                bounds::MAX_TENSORS,
                cfg.output.len()
            ),
        );
    }
    if let Some(p) = &cfg.version_policy {
        if let Some(l) = &p.latest {
            if l.num_versions == 0 || l.num_versions > bounds::MAX_VERSIONS {
                err(
                    "version_policy.latest.num_versions".into(),
                    format!(
                        "must be in 1..={}, got {}",
                        bounds::MAX_VERSIONS,
                        l.num_versions
                    ),
                );
            }
        }
        if let Some(s) = &p.specific {
            if s.versions.is_empty() {
                err(
                    "version_policy.specific.versions".into(),
                    "must list at least one version".into(),
                );
            }
            if s.versions.len() > bounds::MAX_VERSIONS as usize {
                err(
                    "version_policy.specific.versions".into(),
                    format!("at most {} versions", bounds::MAX_VERSIONS),
                );
            }
            for v in &s.versions {
                if *v < 0 {
                    err(
                        "version_policy.specific.versions".into(),
                        format!("version {v} is negative"),
                    );
                }
            }
        }
    }
}

/// `input[]` and `output[]`: each tensor, no duplicates, formats, labels files.
fn check_tensors(cfg: &ModelConfig, model_dir: &Path, err: &mut impl FnMut(String, String)) {
    if cfg.input.is_empty() {
        err(
            "input".into(),
            "the model has no inputs (none configured and none found in the model file)".into(),
        );
    }
    if cfg.output.is_empty() {
        err(
            "output".into(),
            "the model has no outputs (none configured and none found in the model file)".into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in cfg.input.iter().enumerate() {
        let p = format!("input[{i}]");
        check_tensor(err, &p, &t.name, t.data_type, &t.dims, t.reshape.as_ref());
        if !seen.insert(t.name.as_str()) {
            err(format!("{p}.name"), format!("duplicate input '{}'", t.name));
        }
        if t.format != TensorFormat::None && t.dims.len() != 3 {
            err(
                format!("{p}.format"),
                format!(
                    "{} needs 3 dims (without the batch dim), got {:?}",
                    t.format.as_str(),
                    t.dims
                ),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in cfg.output.iter().enumerate() {
        let p = format!("output[{i}]");
        check_tensor(err, &p, &t.name, t.data_type, &t.dims, t.reshape.as_ref());
        if !seen.insert(t.name.as_str()) {
            err(
                format!("{p}.name"),
                format!("duplicate output '{}'", t.name),
            );
        }
        if !t.label_filename.is_empty() {
            match crate::repository::confine(model_dir, &t.label_filename) {
                Err(why) => err(format!("{p}.label_filename"), why),
                Ok(path) if !path.is_file() => err(
                    format!("{p}.label_filename"),
                    format!(
                        "labels file '{}' not found beside config.pbtxt",
                        t.label_filename
                    ),
                ),
                Ok(_) => {}
            }
        }
    }
}

/// `instance_group[]`: CPU only, and bounded counts.
fn check_instances(cfg: &ModelConfig, err: &mut impl FnMut(String, String)) {
    for (i, g) in cfg.instance_group.iter().enumerate() {
        let p = format!("instance_group[{i}]");
        if g.kind == InstanceKind::Gpu {
            err(
                format!("{p}.kind"),
                "KIND_GPU is not supported: Wisp runs models on the CPU (use KIND_CPU)".into(),
            );
        }
        if g.count < 1 || g.count > bounds::MAX_INSTANCES {
            err(
                format!("{p}.count"),
                format!("must be in 1..={}, got {}", bounds::MAX_INSTANCES, g.count),
            );
        }
    }
    let total: i64 = cfg
        .instance_group
        .iter()
        .map(|g| g.count.max(0) as i64)
        .sum();
    if total > bounds::MAX_INSTANCES as i64 {
        err(
            "instance_group".into(),
            format!(
                "at most {} instances in all, got {total}",
                bounds::MAX_INSTANCES
            ),
        );
    }
}

fn check_tensor(
    err: &mut impl FnMut(String, String),
    p: &str,
    name: &str,
    data_type: Option<DataType>,
    dims: &[i64],
    reshape: Option<&Reshape>,
) {
    if name.is_empty() {
        err(format!("{p}.name"), "must not be empty".into());
    }
    let label = if name.is_empty() {
        p.to_string()
    } else {
        format!("{p} '{name}'")
    };
    if data_type.is_none() {
        err(
            format!("{label}.data_type"),
            "must be a valid type such as TYPE_FP32, got none".into(),
        );
    }
    if dims.is_empty() && reshape.is_none() {
        err(
            format!("{label}.dims"),
            "must be set (use [1] with reshape { shape: [] } for a scalar)".into(),
        );
    }
    if dims.len() > bounds::MAX_RANK {
        err(
            format!("{label}.dims"),
            format!(
                "at most {} dimensions, got {}",
                bounds::MAX_RANK,
                dims.len()
            ),
        );
    }
    for &d in dims {
        if d < -1 || d == 0 || d > bounds::MAX_DIM {
            err(
                format!("{label}.dims"),
                format!(
                    "dimension {d} is invalid, expected 1..={} or -1 (variable) in {dims:?}",
                    bounds::MAX_DIM
                ),
            );
        }
    }
    // The product of the fixed dims, if it stays within bounds.
    let elements = |v: &[i64]| {
        v.iter()
            .filter(|&&d| d > 0)
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= bounds::MAX_ELEMENTS)
    };
    if elements(dims).is_none() {
        err(
            format!("{label}.dims"),
            format!("{dims:?} holds more than {} elements", bounds::MAX_ELEMENTS),
        );
    }
    if let Some(r) = reshape {
        if r.shape.len() > bounds::MAX_RANK
            || r.shape
                .iter()
                .any(|&d| !(-1..=bounds::MAX_DIM).contains(&d))
            || elements(&r.shape).is_none()
        {
            err(
                format!("{label}.reshape"),
                format!(
                    "shape {:?} must have at most {} dimensions, each in 1..={} or -1, and at most {} elements",
                    r.shape,
                    bounds::MAX_RANK,
                    bounds::MAX_DIM,
                    bounds::MAX_ELEMENTS
                ),
            );
            return;
        }
        let fixed = |v: &[i64]| v.iter().all(|&d| d > 0);
        if fixed(dims) && fixed(&r.shape) {
            let a = elements(dims).unwrap_or(-1);
            let b = elements(&r.shape).unwrap_or(-1);
            if a != b {
                err(
                    format!("{label}.reshape"),
                    format!(
                        "shape {:?} has {b} elements but dims {dims:?} have {a}",
                        r.shape
                    ),
                );
            }
        }
    }
}
