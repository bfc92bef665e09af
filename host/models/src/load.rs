//! Loading one model: its config prepared (read, auto-completed, validated, integrity-checked),
//! then each selected version's instances created, warmed up and put behind a scheduler.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use wisp_core::backend::{Backend, Instance};
use wisp_core::config::{self, ModelConfig, ModelSpec, Signature};
use wisp_core::repository::{self, ModelDir};
use wisp_core::{DataType, Error, InferRequest, Result};
use wisp_scheduler::sequence::Sequencer;
use wisp_scheduler::{Observer, Policy, Scheduler};

use super::entry::{ModelEntry, ModelVersion, VersionState};
use super::warmup::warm_up;

/// A source of per-request observers, one per model version (the metrics exporter is one).
pub trait Observers: Send + Sync {
    /// The observer for `model` version `version`, if it wants one.
    fn observer(&self, model: &str, version: u64) -> Option<Observer>;
}

/// Options for loading.
pub struct LoadOptions {
    /// Fill missing config from the model file.
    pub autocomplete: bool,
    /// Parallel loads at start-up.
    pub threads: usize,
    /// Where per-request timings go (the Prometheus latency summaries), if anywhere.
    pub observers: Option<Arc<dyn Observers>>,
    /// `--host-policy` CPU sets for `instance_group.host_policy`.
    pub host_policies: crate::host_policy::HostPolicies,
    /// `--model-verify-key`: check signed manifests before loading a version.
    pub verification: Option<crate::signing::Verification>,
    /// `--state-dir`: where rolled-back versions are remembered across restarts.
    pub state_dir: Option<std::path::PathBuf>,
    /// `--rate-limit execution_count`: the server's resource pool that instances with an
    /// `instance_group.rate_limiter` wait on.
    pub rate_limiter: Option<Arc<wisp_scheduler::rate_limit::RateLimiter>>,
}

/// Loads one model, leaving out the versions in `withheld`; failures are recorded in the
/// entry, never returned. A version its gate covers is judged against its baseline (see
/// [`crate::gate`]; `previous` is what serves the model now) before the entry is returned.
/// Failure reasons reach any client (the repository index, readiness errors), so paths in
/// them are made relative to the repository. A panic while loading (a compiler's internal error on a component, say)
/// fails this model only, never the server.
pub(super) fn load_model(
    dir: &ModelDir,
    backend: &dyn Backend,
    opts: &LoadOptions,
    config_json: Option<&str>,
    withheld: &[u64],
    previous: Option<&ModelEntry>,
) -> ModelEntry {
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        load_model_inner(dir, backend, opts, config_json, withheld, previous)
    }));
    let mut entry = loaded.unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        tracing::error!(model = %dir.name, panic = %what, "loading the model panicked");
        ModelEntry::broken(
            &dir.name,
            format!("loading panicked (an internal error of the engine or compiler): {what}"),
        )
    });
    let Some(root) = dir.path.parent() else {
        return entry;
    };
    let mut prefixes = vec![format!("{}/", root.display())];
    if let Ok(real) = root.canonicalize() {
        prefixes.push(format!("{}/", real.display()));
    }
    let scrub = |msg: &mut String| {
        for p in &prefixes {
            if msg.contains(p.as_str()) {
                *msg = msg.replace(p.as_str(), "");
            }
        }
    };
    if let Some(e) = entry.error.as_mut() {
        scrub(e);
    }
    for o in &mut entry.gated {
        let mut report = (*o.report).clone();
        report.failures.iter_mut().for_each(&scrub);
        o.report = Arc::new(report);
    }
    for state in entry.versions.values_mut() {
        if let VersionState::Unavailable(r) = state {
            scrub(r);
        }
    }
    entry
}

fn load_model_inner(
    dir: &ModelDir,
    backend: &dyn Backend,
    opts: &LoadOptions,
    config_json: Option<&str>,
    withheld: &[u64],
    previous: Option<&ModelEntry>,
) -> ModelEntry {
    let start = Instant::now();
    let name = dir.name.as_str();
    let (spec, verified) = match prepare_config_from(
        dir,
        backend,
        opts.autocomplete,
        config_json,
        opts.verification.as_ref(),
    ) {
        Ok(prepared) => prepared,
        Err(e) => {
            tracing::error!(model = name, error = %e, "model failed to load");
            return ModelEntry::broken(name, e);
        }
    };
    let cfg = &spec.config;
    for field in cfg.unsupported_fields() {
        tracing::warn!(
            model = name,
            field,
            "config field is valid Triton but not supported by Wisp; ignored"
        );
    }
    let mut labels = HashMap::new();
    for o in cfg.output.iter().filter(|o| !o.label_filename.is_empty()) {
        let path = repository::confine(&dir.path, &o.label_filename)
            .map_err(|why| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why));
        match path.and_then(|p| config::read_labels(&p)) {
            Ok(l) => {
                labels.insert(o.name.clone(), Arc::new(l));
            }
            Err(e) => {
                return ModelEntry::broken(
                    name,
                    format!("cannot read labels file '{}': {e}", o.label_filename),
                )
            }
        }
    }
    let policy = cfg.version_policy.clone().unwrap_or_default();
    let mut available = repository::versions(&dir.path);
    available.retain(|v| !withheld.contains(v));
    let selected = match repository::select_versions(&policy, &available) {
        Ok(v) if v.is_empty() => {
            return ModelEntry::broken(
                name,
                format!("no version directory (e.g. '1/') in {}", dir.path.display()),
            )
        }
        Ok(v) => v,
        Err(e) => return ModelEntry::broken(name, e),
    };
    // Loads one version, its signature checked before anything reads its files (once: the
    // version auto-complete read is checked already).
    let load_one = |v: u64| {
        let observer = opts.observers.as_ref().and_then(|o| o.observer(name, v));
        let checked = match opts.verification.as_ref().filter(|_| verified != Some(v)) {
            Some(ver) => ver
                .check(&dir.path, &dir.name, v)
                .map_err(|why| Error::invalid(format!("integrity check failed: {why}"))),
            None => Ok(()),
        };
        checked.and_then(|()| load_version(dir, v, &spec, &labels, backend, observer, opts))
    };
    let mut loaded = BTreeMap::new();
    for v in selected {
        let version = load_one(v);
        match &version {
            Ok(m) => tracing::info!(
                model = name,
                version = v,
                engine = %m.engine,
                secs = start.elapsed().as_secs_f64(),
                "model version ready"
            ),
            Err(e) => {
                tracing::error!(model = name, version = v, error = %e, "model version failed to load")
            }
        }
        loaded.insert(v, version);
    }
    let gated = match &spec.params.gate {
        Some(gate) => match held_out(dir, cfg, &spec.signature) {
            Ok(samples) => {
                crate::gate::apply(name, gate, &samples, &mut loaded, previous, load_one)
            }
            Err(e) => return ModelEntry::broken(name, e),
        },
        None => Vec::new(),
    };
    let versions = loaded
        .into_iter()
        .map(|(v, m)| {
            let state = match m {
                Ok(m) => VersionState::Ready(Arc::new(m)),
                Err(e) => VersionState::Unavailable(e.to_string()),
            };
            (v, state)
        })
        .collect();
    ModelEntry {
        name: name.to_string(),
        versions,
        error: None,
        gated,
    }
}

/// A gate's held-out inputs: the model's `model_warmup` samples, as requests.
fn held_out(dir: &ModelDir, cfg: &ModelConfig, sig: &Signature) -> Result<Vec<InferRequest>> {
    cfg.model_warmup
        .iter()
        .map(|sample| {
            super::warmup::warmup_request(&dir.path, sig, sample)
                .map_err(|e| e.context(format!("gate: held-out sample '{}'", sample.name)))
        })
        .collect()
}

/// Reads, normalizes, auto-completes and validates one model's config into its spec (what
/// loading does before creating instances; the benchmark uses it to call a backend directly).
pub fn prepare_config(
    dir: &ModelDir,
    backend: &dyn Backend,
    autocomplete: bool,
) -> Result<ModelSpec> {
    prepare_config_from(dir, backend, autocomplete, None, None).map(|(spec, _)| spec)
}

/// As [`prepare_config`], from a load request's `config_json` when given; with `verification`,
/// the version auto-complete reads is checked first, and returned so that it is not hashed
/// twice.
pub(super) fn prepare_config_from(
    dir: &ModelDir,
    backend: &dyn Backend,
    autocomplete: bool,
    config_json: Option<&str>,
    verification: Option<&crate::signing::Verification>,
) -> Result<(ModelSpec, Option<u64>)> {
    let mut verified = None;
    let name = dir.name.as_str();
    let mut cfg = match config_json {
        Some(json) => config::config_from_json(json)
            .map_err(|e| e.context(format!("model '{name}': 'config' parameter")))?,
        None => {
            let path = dir.path.join("config.pbtxt");
            let text = match wisp_core::repository::read_regular_text(
                &path,
                wisp_core::repository::MAX_SMALL_FILE_BYTES,
            ) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && autocomplete => String::new(),
                Err(e) => {
                    return Err(Error::invalid(format!(
                        "cannot read {}: {e}",
                        path.display()
                    )))
                }
            };
            config::parse_pbtxt(name, &text)?
        }
    };
    config::normalize(&mut cfg, name, &dir.path);
    // Before auto-complete opens the model file: it must be inside the model directory.
    config::check_model_filename(&cfg.default_model_filename, &dir.path).map_err(|why| {
        Error::invalid(format!(
            "invalid config for model '{name}': default_model_filename: {why}"
        ))
    })?;
    // A plugin describes itself only when asked: instantiating one to ask costs a compile.
    let wasm_incomplete = cfg.is_wasm() && (cfg.input.is_empty() || cfg.output.is_empty());
    if autocomplete && (cfg.is_onnx() || wasm_incomplete) {
        let latest = repository::select_versions(
            cfg.version_policy.as_ref().expect("normalized"),
            &repository::versions(&dir.path),
        )?;
        if let Some(v) = latest.last() {
            let file = model_file(&dir.path, *v, &cfg);
            if let Some(ver) = verification {
                // Auto-complete parses the model file: only once its signature checks out.
                ver.check(&dir.path, &dir.name, *v).map_err(|why| {
                    Error::invalid(format!("version {v}: integrity check failed: {why}"))
                })?;
                verified = Some(*v);
            }
            if file.is_file() {
                let io = backend.describe(&file)?;
                config::autocomplete(&mut cfg, &io);
                config::normalize(&mut cfg, name, &dir.path);
            }
        }
    }
    // `wasm.*`, `openai.*` and `sla.*` parameters are read and checked here with the rest:
    // one that does not fit fails the load, not each call.
    let spec = config::validate(cfg, name, &dir.path)?;
    // (a sandbox is read exactly for a plugin's config)
    if let (Some(_), Some(sandbox)) = (&config_json, &spec.params.sandbox) {
        // A config from the network may narrow the repository's sandbox, never widen it.
        let base = match wisp_core::repository::read_regular_text(
            &dir.path.join("config.pbtxt"),
            wisp_core::repository::MAX_SMALL_FILE_BYTES,
        ) {
            Ok(text) => config::parse_pbtxt(name, &text)?,
            Err(_) => ModelConfig {
                name: name.to_string(),
                ..Default::default()
            },
        };
        wisp_core::config::params::check_override_narrows(&base, &spec.config, sandbox, &dir.path)?;
    }
    Ok((spec, verified))
}

/// Whether a model directory holds an ensemble (judged from its config text).
pub(super) fn is_ensemble_dir(dir: &ModelDir) -> bool {
    read_config(dir).is_ok_and(|c| c.is_ensemble())
}

/// A model directory's `config.pbtxt`, parsed (not normalized or validated).
pub(super) fn read_config(dir: &ModelDir) -> Result<ModelConfig> {
    let path = dir.path.join("config.pbtxt");
    let text = wisp_core::repository::read_regular_text(
        &path,
        wisp_core::repository::MAX_SMALL_FILE_BYTES,
    )
    .map_err(|e| Error::invalid(format!("cannot read {}: {e}", path.display())))?;
    Ok(config::parse_pbtxt(&dir.name, &text)?)
}

/// The model file of `version`.
pub fn model_file(model_dir: &Path, version: u64, cfg: &ModelConfig) -> std::path::PathBuf {
    model_dir
        .join(version.to_string())
        .join(&cfg.default_model_filename)
}

fn load_version(
    dir: &ModelDir,
    version: u64,
    spec: &ModelSpec,
    labels: &HashMap<String, Arc<Vec<String>>>,
    backend: &dyn Backend,
    observer: Option<Observer>,
    opts: &LoadOptions,
) -> Result<ModelVersion> {
    let start = Instant::now();
    let cfg = &spec.config;
    let file = model_file(&dir.path, version, cfg);
    if !cfg.is_ensemble() {
        repository::confine(
            &dir.path.join(version.to_string()),
            &cfg.default_model_filename,
        )
        .map_err(|why| Error::invalid(format!("default_model_filename: {why}")))?;
    }
    if !cfg.is_ensemble() {
        // Only a regular file within the bound is loaded (a FIFO would hang the load).
        match repository::open_regular(&file, repository::MAX_MODEL_FILE_BYTES) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!(
                    "model file {} not found",
                    file.display()
                )))
            }
            Err(e) => return Err(Error::invalid(format!("cannot read the model file: {e}"))),
        }
    }
    // Under --model-verify-key, the backend checks the bytes it reads against the signed
    // manifest's hash of the model file (the version's files were checked a moment ago; this
    // closes the window between that check and the backend's read).
    let signed = match (&opts.verification, cfg.is_ensemble()) {
        (Some(v), false) => {
            let rel = file.strip_prefix(&dir.path).unwrap_or(&file);
            crate::signing::signed_sha256(&dir.path, version, rel, v)
                .map_err(|why| Error::invalid(format!("integrity check failed: {why}")))?
        }
        _ => None,
    };
    let with_digest;
    let spec = match signed {
        Some(sha) => {
            with_digest = ModelSpec {
                file_sha256: Some(sha),
                ..spec.clone()
            };
            &with_digest
        }
        None => spec,
    };
    let sequencing = spec.sequence.clone();
    let loaded = match &sequencing {
        // The backend also sees the inputs and outputs the sequence batcher feeds and reads.
        Some(seq) => backend.load(&with_sequence_io(spec, seq)?, &file)?,
        None => backend.load(spec, &file)?,
    };
    let mut labels = labels.clone();
    for (output, found) in loaded.output_labels() {
        labels.entry(output).or_insert(found);
    }
    let cores = instance_cores(cfg, &opts.host_policies)?;
    let mut instances = (0..cfg.instance_count())
        .map(|i| loaded.new_instance(i).map(|inst| pin(inst, cores[i])))
        .collect::<Result<Vec<_>>>()?;
    warm_up(&dir.path, cfg, &spec.signature, &mut instances)?;
    let probe = spec
        .params
        .sla
        .as_ref()
        .map(|_| Arc::new(super::rollout::Probe::default()));
    let observer = match &probe {
        Some(p) => Some(p.observer(observer)),
        None => observer,
    };
    let limits = match &opts.rate_limiter {
        Some(limiter) => {
            let needs = crate::rate_limit::instance_needs(cfg)?;
            for n in &needs {
                limiter.check(&dir.name, n)?;
            }
            Some((limiter.clone(), needs))
        }
        None => None,
    };
    let scheduler = Arc::new(Scheduler::start(
        &dir.name,
        Policy::from_config(cfg, sequencing.as_ref()),
        instances,
        observer,
    )?);
    if let Some((limiter, needs)) = limits {
        scheduler.set_rate_limits(limiter, needs);
    }
    let sequencer = sequencing.map(|seq| {
        Sequencer::new(
            &dir.name,
            seq,
            cfg.max_batch_size,
            cfg.output.iter().map(|o| o.name.clone()).collect(),
            &scheduler,
            cfg.instance_count(),
        )
    });
    let first_response = first_response(&dir.name, cfg)?;
    let engine = loaded.engine().to_string();
    let composing = spec
        .steps
        .iter()
        .map(|s| (s.model.clone(), s.version))
        .collect();
    Ok(ModelVersion {
        composing,
        loaded: Arc::from(loaded),
        name: dir.name.clone(),
        version,
        config: cfg.clone(),
        signature: spec.signature.clone(),
        labels,
        engine,
        load_secs: start.elapsed().as_secs_f64(),
        loaded_at: std::time::SystemTime::now(),
        params: spec.params.clone(),
        first_response,
        gate: None,
        probe,
        scheduler,
        sequencer,
    })
}

/// A decoupled model's time-to-first-response histogram, with its `model_metrics` buckets; a
/// family that cannot be customised is named in a warning, in Triton's words.
fn first_response(
    model: &str,
    cfg: &ModelConfig,
) -> Result<Option<Arc<crate::first_response::FirstResponse>>> {
    let metrics = config::metrics::read(cfg).map_err(Error::invalid)?;
    for family in &metrics.ignored_families {
        tracing::warn!(
            model,
            "Metric family '{family}' in 'metric_identifier' is not a customizable metric in Triton core."
        );
    }
    Ok(cfg.decoupled().then(|| {
        Arc::new(crate::first_response::FirstResponse::new(
            metrics.first_response_buckets,
        ))
    }))
}

/// `spec` with the sequence batcher's control and state inputs, and its state outputs, listed
/// as the backend needs them (the config and signature clients see do not list them, as in
/// Triton).
fn with_sequence_io(
    spec: &ModelSpec,
    seq: &config::sequence::SequenceBatching,
) -> Result<ModelSpec> {
    let mut full = (*spec.config).clone();
    let mut input = |name: &str, datatype: DataType, dims: &[i64]| {
        full.input.push(config::ModelInput {
            name: name.to_string(),
            data_type: Some(datatype),
            dims: dims.to_vec(),
            ..Default::default()
        });
    };
    for c in &seq.controls {
        input(&c.name, c.datatype, &[1]);
    }
    for s in &seq.states {
        input(&s.input_name, s.datatype, &s.dims);
    }
    for s in &seq.states {
        if !full.output.iter().any(|o| o.name == s.output_name) {
            full.output.push(config::ModelOutput {
                name: s.output_name.clone(),
                data_type: Some(s.datatype),
                dims: s.dims.clone(),
                ..Default::default()
            });
        }
    }
    // One derivation of the signature, the one `validate` uses, so the two cannot drift.
    let signature = Signature::of(&full).map_err(|e| config::ConfigErrors {
        model: full.name.clone(),
        errors: vec![e],
    })?;
    Ok(ModelSpec {
        config: Arc::new(full),
        signature: Arc::new(signature),
        ..spec.clone()
    })
}

/// The core each instance (in group order) is pinned to, from its group's `host_policy`.
pub(super) fn instance_cores(
    cfg: &ModelConfig,
    policies: &crate::host_policy::HostPolicies,
) -> Result<Vec<Option<usize>>> {
    let mut out = Vec::new();
    for g in &cfg.instance_group {
        let cores = policies.cores(&g.host_policy)?;
        for k in 0..g.count.max(0) as usize {
            out.push(cores.map(|c| c[k % c.len()]));
        }
    }
    Ok(out)
}

pub(super) fn pin(instance: Box<dyn Instance>, core: Option<usize>) -> Box<dyn Instance> {
    match core {
        Some(c) => Box::new(crate::host_policy::Pinned::new(instance, c)),
        None => instance,
    }
}
