//! Model lifecycle: every model of the repositories is loaded at start-up (in parallel), each
//! version behind its own scheduler. A broken model or version is kept as UNAVAILABLE with its
//! reason and never stops the others from loading.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use wisp_core::backend::{Backend, ExecTiming, Instance, LoadedModel};
use wisp_core::config::{self, ModelConfig, ModelWarmup};
use wisp_core::repository::{self, ModelDir};
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};
use wisp_scheduler::{ModelStats, Observer, Policy, Scheduler};

use crate::metrics::Metrics;

/// One loaded, ready model version.
pub struct ModelVersion {
    /// Model name.
    pub name: String,
    /// Version number.
    pub version: u64,
    /// The normalized, auto-completed, validated config.
    pub config: Arc<ModelConfig>,
    /// Labels per output name (from `label_filename`).
    pub labels: HashMap<String, Arc<Vec<String>>>,
    /// The engine that runs it.
    pub engine: String,
    /// Seconds it took to load (and warm up).
    pub load_secs: f64,
    /// For an ensemble, the models its steps call, with the version each asks for (read from
    /// the config once, at load).
    pub composing: Vec<(String, Option<u64>)>,
    scheduler: Arc<Scheduler>,
    loaded: Arc<dyn LoadedModel>,
}

impl ModelVersion {
    /// Runs one request through the scheduler and waits for its response without blocking the
    /// async runtime.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.scheduler.enqueue(
            request,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.await.map_err(|_| {
            Error::internal(format!(
                "model '{}' dropped the request without answering",
                self.name
            ))
        })?
    }

    /// Queues one request; `respond` is called once with its outcome.
    pub fn submit(&self, request: InferRequest, respond: wisp_scheduler::Responder) -> Result<()> {
        self.scheduler.enqueue(request, respond)
    }

    /// Runs one request through the scheduler from a thread that may block (a plugin's
    /// wasi-nn call), waiting at most until `deadline`.
    pub fn infer_blocking(
        &self,
        request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.scheduler.enqueue(
            request,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::unavailable(format!(
                "model '{}' did not answer before the caller's deadline",
                self.name
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::internal(format!(
                "model '{}' dropped the request without answering",
                self.name
            ))),
        }
    }

    /// The version's statistics.
    pub fn stats(&self) -> &Arc<ModelStats> {
        self.scheduler.stats()
    }

    /// Requests queued, not yet executing.
    pub fn pending(&self) -> usize {
        self.scheduler.pending()
    }

    /// Stops the scheduler after it drains its queue (blocking). Dropping the last reference
    /// does the same.
    fn stop(&self) {
        self.scheduler.stop();
    }
}

/// A version's state.
#[derive(Clone)]
pub enum VersionState {
    /// Serving.
    Ready(Arc<ModelVersion>),
    /// Failed to load, with the reason.
    Unavailable(String),
}

/// A model and its versions.
#[derive(Clone)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// Versions selected by the version policy.
    pub versions: BTreeMap<u64, VersionState>,
    /// Why the whole model failed (bad config, no versions...), if it did.
    pub error: Option<String>,
}

impl ModelEntry {
    fn broken(name: &str, reason: impl std::fmt::Display) -> Self {
        ModelEntry {
            name: name.to_string(),
            versions: BTreeMap::new(),
            error: Some(reason.to_string()),
        }
    }

    /// The model is ready when it has at least one ready version and no model-level error.
    pub fn is_ready(&self) -> bool {
        self.error.is_none()
            && self
                .versions
                .values()
                .any(|v| matches!(v, VersionState::Ready(_)))
    }

    /// Why the model is not ready.
    pub fn reason(&self) -> String {
        if let Some(e) = &self.error {
            return e.clone();
        }
        let reasons: Vec<String> = self
            .versions
            .iter()
            .filter_map(|(v, s)| match s {
                VersionState::Unavailable(r) => Some(format!("version {v}: {r}")),
                VersionState::Ready(_) => None,
            })
            .collect();
        reasons.join("; ")
    }
}

/// Options for loading.
pub struct LoadOptions {
    /// Fill missing config from the model file.
    pub autocomplete: bool,
    /// Parallel loads at start-up.
    pub threads: usize,
    /// Where per-request latency summaries go, if enabled.
    pub metrics: Option<Arc<Metrics>>,
    /// `--host-policy` CPU sets for `instance_group.host_policy`.
    pub host_policies: crate::host_policy::HostPolicies,
    /// `--model-verify-key`: check signed manifests before loading a version.
    pub verification: Option<crate::signing::Verification>,
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, when the row is about one.
    pub version: Option<u64>,
    /// `READY`, `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is not ready (or why its last reload failed while it keeps serving).
    pub reason: String,
}

/// All models of the server. Loaded models live in a map of immutable entries; a load builds a
/// new entry beside the old one and swaps it in atomically, so requests in flight keep the old
/// version alive (through its `Arc`) until they finish, and it is dropped — its scheduler
/// drained, its memory returned — when the last of them completes.
pub struct Registry {
    roots: Vec<std::path::PathBuf>,
    backend: Arc<dyn Backend>,
    opts: LoadOptions,
    models: RwLock<BTreeMap<String, Arc<ModelEntry>>>,
    /// Serializes load/unload of one model.
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Why the last reload of a still-serving model failed.
    reload_errors: Mutex<HashMap<String, String>>,
    /// Repository fingerprint of each model at its last load attempt (poll mode).
    fingerprints: Mutex<HashMap<String, u64>>,
    /// The same without `config.pbtxt`: unchanged model files allow an in-place resize.
    file_prints: Mutex<HashMap<String, u64>>,
}

impl Registry {
    /// An empty registry over `roots`.
    pub fn new(
        roots: Vec<std::path::PathBuf>,
        backend: Arc<dyn Backend>,
        opts: LoadOptions,
    ) -> Self {
        Registry {
            roots,
            backend,
            opts,
            models: RwLock::new(BTreeMap::new()),
            locks: Mutex::new(HashMap::new()),
            reload_errors: Mutex::new(HashMap::new()),
            fingerprints: Mutex::new(HashMap::new()),
            file_prints: Mutex::new(HashMap::new()),
        }
    }

    /// Loads the named models (all when `names` is `None`), in parallel (blocking).
    pub fn load_initial(&self, names: Option<&[String]>) -> Result<()> {
        let scan = repository::scan(&self.roots)?;
        {
            let mut models = self.models.write().expect("registry lock");
            for (n, e) in scan.broken {
                models.insert(n.clone(), Arc::new(ModelEntry::broken(&n, e)));
            }
        }
        let wanted: Vec<ModelDir> = match names {
            None => scan.models,
            Some(list) if list.iter().any(|n| n == "*") => scan.models,
            Some(list) => {
                for n in list {
                    if !scan.models.iter().any(|m| &m.name == n) {
                        return Err(Error::not_found(format!(
                            "--load-model {n}: no such model in the repositories"
                        )));
                    }
                }
                scan.models
                    .into_iter()
                    .filter(|m| list.contains(&m.name))
                    .collect()
            }
        };
        // Ensembles load after the models they compose (and after each other, in passes,
        // for ensembles of ensembles).
        let (mut ensembles, models): (Vec<ModelDir>, Vec<ModelDir>) =
            wanted.into_iter().partition(is_ensemble_dir);
        let queue = Mutex::new(models);
        std::thread::scope(|s| {
            for _ in 0..self.opts.threads.max(1) {
                s.spawn(|| loop {
                    let Some(dir) = queue.lock().expect("load queue").pop() else {
                        return;
                    };
                    let _ = self.load_dir(&dir, None);
                });
            }
        });
        while !ensembles.is_empty() {
            let before = ensembles.len();
            ensembles.retain(|dir| self.load_dir(dir, None).is_err());
            if ensembles.len() == before {
                break;
            }
        }
        Ok(())
    }

    fn lock_for(&self, name: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .expect("locks")
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    fn find_dir(&self, name: &str) -> Result<ModelDir> {
        let scan = repository::scan(&self.roots)?;
        if let Some((_, e)) = scan.broken.into_iter().find(|(n, _)| n == name) {
            return Err(e);
        }
        scan.models
            .into_iter()
            .find(|m| m.name == name)
            .ok_or_else(|| {
                Error::not_found(format!(
                    "unknown model: '{name}' is not in the model repositories"
                ))
            })
    }

    /// Loads, or reloads, a model (blocking). `config_json` replaces its `config.pbtxt` (Triton's
    /// `config` load parameter). On failure a model that was serving keeps serving, and the
    /// reason is reported by [`Registry::index`].
    pub fn load(&self, name: &str, config_json: Option<&str>) -> Result<()> {
        let dir = self.find_dir(name)?;
        self.load_dir(&dir, config_json)
    }

    fn load_dir(&self, dir: &ModelDir, config_json: Option<&str>) -> Result<()> {
        let lock = self.lock_for(&dir.name);
        let _guard = lock.lock().expect("model lock");
        self.fingerprints
            .lock()
            .expect("fingerprints")
            .insert(dir.name.clone(), fingerprint(&dir.path));
        let files = fingerprint_files(&dir.path);
        let old_files = self
            .file_prints
            .lock()
            .expect("fingerprints")
            .insert(dir.name.clone(), files);
        if old_files == Some(files) {
            if let Some(done) = self.try_resize(dir, config_json) {
                return done;
            }
        }
        let entry = load_model(dir, self.backend.as_ref(), &self.opts, config_json);
        let mut models = self.models.write().expect("registry lock");
        let old_ready = models.get(&dir.name).is_some_and(|e| e.is_ready());
        if entry.is_ready() || !old_ready {
            let err = (!entry.is_ready()).then(|| entry.reason());
            models.insert(dir.name.clone(), Arc::new(entry));
            drop(models);
            self.reload_errors
                .lock()
                .expect("reload errors")
                .remove(&dir.name);
            match err {
                None => Ok(()),
                Some(e) => Err(Error::invalid(format!(
                    "failed to load '{}': {e}",
                    dir.name
                ))),
            }
        } else {
            drop(models);
            let reason = format!(
                "reload failed, previous version still serving: {}",
                entry.reason()
            );
            tracing::error!(model = %dir.name, %reason, "model reload failed");
            self.reload_errors
                .lock()
                .expect("reload errors")
                .insert(dir.name.clone(), reason.clone());
            Err(Error::invalid(format!(
                "failed to load '{}': {reason}",
                dir.name
            )))
        }
    }

    /// When only `instance_group.count` changed (same files, same config otherwise), grows or
    /// shrinks each version's instance pool in place: same queue, same statistics, no reload.
    /// `None` when a full reload is needed.
    fn try_resize(&self, dir: &ModelDir, config_json: Option<&str>) -> Option<Result<()>> {
        let old = self
            .models
            .read()
            .expect("registry lock")
            .get(&dir.name)
            .cloned()?;
        if old.error.is_some()
            || old
                .versions
                .values()
                .any(|v| !matches!(v, VersionState::Ready(_)))
        {
            return None;
        }
        let first = old.versions.values().find_map(|v| match v {
            VersionState::Ready(m) => Some(m.clone()),
            VersionState::Unavailable(_) => None,
        })?;
        // With signatures on, resize only what verifies; anything else goes through the full
        // load, which reports (and counts) the failure once.
        if let Some(v) = &self.opts.verification {
            let versions = repository::versions(&dir.path);
            if versions
                .iter()
                .any(|&ver| crate::signing::verify(&dir.path, ver, v).is_err())
            {
                return None;
            }
        }
        let new_cfg = prepare_config_from(
            dir,
            self.backend.as_ref(),
            self.opts.autocomplete,
            config_json,
            None,
        )
        .ok()?
        .0;
        let without_counts = |c: &ModelConfig| {
            let mut c = c.clone();
            c.instance_group.iter_mut().for_each(|g| g.count = 0);
            c
        };
        if without_counts(&new_cfg) != without_counts(&first.config) || new_cfg == *first.config {
            return None;
        }
        let policy = new_cfg.version_policy.clone().unwrap_or_default();
        let selected =
            repository::select_versions(&policy, &repository::versions(&dir.path)).ok()?;
        if selected != old.versions.keys().copied().collect::<Vec<_>>() {
            return None;
        }
        let new_cfg = Arc::new(new_cfg);
        let target = new_cfg.instance_count();
        let mut versions = BTreeMap::new();
        for (v, state) in &old.versions {
            let VersionState::Ready(m) = state else {
                return None;
            };
            let current = m.scheduler.instance_count();
            if target > current {
                let cores = match instance_cores(&new_cfg, &self.opts.host_policies) {
                    Ok(c) => c,
                    Err(e) => return Some(Err(e)),
                };
                let mut added = match (current..target)
                    .map(|i| {
                        m.loaded
                            .new_instance(i)
                            .map(|inst| pin(inst, cores.get(i).copied().flatten()))
                    })
                    .collect::<Result<Vec<_>>>()
                {
                    Ok(a) => a,
                    Err(e) => return Some(Err(e)),
                };
                if let Err(e) = warm_up(&dir.path, &new_cfg, &mut added) {
                    return Some(Err(e));
                }
                if let Err(e) = m.scheduler.add_instances(added) {
                    return Some(Err(e));
                }
            } else {
                m.scheduler.retire_instances(current - target);
            }
            versions.insert(
                *v,
                VersionState::Ready(Arc::new(ModelVersion {
                    name: m.name.clone(),
                    version: m.version,
                    config: new_cfg.clone(),
                    labels: m.labels.clone(),
                    engine: m.engine.clone(),
                    load_secs: m.load_secs,
                    composing: m.composing.clone(),
                    scheduler: m.scheduler.clone(),
                    loaded: m.loaded.clone(),
                })),
            );
        }
        tracing::info!(model = %dir.name, instances = target, "instance group resized in place");
        self.models.write().expect("registry lock").insert(
            dir.name.clone(),
            Arc::new(ModelEntry {
                name: dir.name.clone(),
                versions,
                error: None,
            }),
        );
        Some(Ok(()))
    }

    /// Unloads a model: it stops taking requests at once; those already accepted finish.
    pub fn unload(&self, name: &str) -> Result<()> {
        let lock = self.lock_for(name);
        let _guard = lock.lock().expect("model lock");
        let removed = self.models.write().expect("registry lock").remove(name);
        self.reload_errors
            .lock()
            .expect("reload errors")
            .remove(name);
        self.fingerprints.lock().expect("fingerprints").remove(name);
        self.file_prints.lock().expect("fingerprints").remove(name);
        match removed {
            Some(_) => {
                tracing::info!(model = name, "model unloaded");
                Ok(())
            }
            None => {
                self.find_dir(name)?;
                Ok(())
            }
        }
    }

    /// Poll mode: loads new models, reloads changed ones, unloads removed ones. One model's
    /// failure never stops the others (blocking).
    pub fn poll(&self) {
        let scan = match repository::scan(&self.roots) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "repository poll failed");
                return;
            }
        };
        let loaded: Vec<String> = self
            .models
            .read()
            .expect("registry lock")
            .keys()
            .cloned()
            .collect();
        for name in loaded {
            if !scan.models.iter().any(|m| m.name == name)
                && !scan.broken.iter().any(|(n, _)| *n == name)
            {
                let _ = self.unload(&name);
            }
        }
        for dir in &scan.models {
            let known = self
                .fingerprints
                .lock()
                .expect("fingerprints")
                .get(&dir.name)
                .copied();
            if known != Some(fingerprint(&dir.path)) {
                tracing::info!(model = %dir.name, "repository change detected; loading");
                let _ = self.load_dir(dir, None);
            }
        }
    }

    /// The repository index: every model of the repositories, loaded or not.
    pub fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>> {
        let scan = repository::scan(&self.roots)?;
        let models = self.models.read().expect("registry lock");
        let errors = self.reload_errors.lock().expect("reload errors");
        let mut names: Vec<String> = scan.models.iter().map(|m| m.name.clone()).collect();
        names.extend(scan.broken.iter().map(|(n, _)| n.clone()));
        names.extend(models.keys().cloned());
        names.sort();
        names.dedup();
        let mut out = Vec::new();
        for name in names {
            let Some(entry) = models.get(&name) else {
                if !ready_only {
                    out.push(IndexEntry {
                        name,
                        version: None,
                        state: "UNAVAILABLE",
                        reason: "unloaded".into(),
                    });
                }
                continue;
            };
            if let Some(e) = &entry.error {
                if !ready_only {
                    out.push(IndexEntry {
                        name,
                        version: None,
                        state: "UNAVAILABLE",
                        reason: e.clone(),
                    });
                }
                continue;
            }
            for (v, state) in &entry.versions {
                let (st, reason) = match state {
                    VersionState::Ready(_) => {
                        ("READY", errors.get(&name).cloned().unwrap_or_default())
                    }
                    VersionState::Unavailable(r) => ("UNAVAILABLE", r.clone()),
                };
                if ready_only && st != "READY" {
                    continue;
                }
                out.push(IndexEntry {
                    name: name.clone(),
                    version: Some(*v),
                    state: st,
                    reason,
                });
            }
        }
        Ok(out)
    }

    /// A snapshot of every loaded (or failed) model, by name.
    pub fn models(&self) -> BTreeMap<String, Arc<ModelEntry>> {
        self.models.read().expect("registry lock").clone()
    }

    /// Whether every model is ready.
    pub fn all_ready(&self) -> bool {
        self.models
            .read()
            .expect("registry lock")
            .values()
            .all(|e| e.is_ready())
    }

    /// The model entry, or NOT_FOUND.
    pub fn entry(&self, name: &str) -> Result<Arc<ModelEntry>> {
        self.models
            .read()
            .expect("registry lock")
            .get(name)
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!("Request for unknown model: '{name}' is not found"))
            })
    }

    /// The ready version to serve: `version` if given, else the highest ready one.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelVersion>> {
        let entry = self.entry(name)?;
        if let Some(e) = &entry.error {
            return Err(Error::unavailable(format!(
                "model '{name}' is not ready: {e}"
            )));
        }
        match version.filter(|v| !v.is_empty()) {
            Some(v) => {
                let n: u64 = v.parse().map_err(|_| {
                    Error::invalid(format!(
                        "version '{v}' of model '{name}' is not a non-negative integer"
                    ))
                })?;
                match entry.versions.get(&n) {
                    Some(VersionState::Ready(m)) => Ok(m.clone()),
                    Some(VersionState::Unavailable(r)) => Err(Error::unavailable(format!(
                        "version {n} of model '{name}' is not ready: {r}"
                    ))),
                    None => Err(Error::not_found(format!(
                        "Request for unknown model: '{name}' version {n} is not found (served: {})",
                        versions_list(&entry)
                    ))),
                }
            }
            None => entry
                .versions
                .values()
                .rev()
                .find_map(|s| match s {
                    VersionState::Ready(m) => Some(m.clone()),
                    VersionState::Unavailable(_) => None,
                })
                .ok_or_else(|| {
                    Error::unavailable(format!(
                        "model '{name}' has no ready version: {}",
                        entry.reason()
                    ))
                }),
        }
    }

    /// Whether `name` (at `version`) can answer now: it is ready and, for an ensemble, so is
    /// every model its steps use (recursively). The error says which one is not.
    pub fn check_ready(&self, name: &str, version: Option<&str>) -> Result<()> {
        self.check_ready_depth(name, version, 0)
    }

    fn check_ready_depth(&self, name: &str, version: Option<&str>, depth: usize) -> Result<()> {
        let m = self.get(name, version)?;
        if !m.config.is_ensemble() || depth > 16 {
            return Ok(());
        }
        for (i, (model, version)) in m.composing.iter().enumerate() {
            let v = version.map(|v| v.to_string());
            self.check_ready_depth(model, v.as_deref(), depth + 1)
                .map_err(|e| {
                    Error::unavailable(format!(
                        "ensemble '{name}' step {i} ('{model}') is not ready: {}",
                        e.message()
                    ))
                })?;
        }
        Ok(())
    }

    /// Stops every scheduler after draining (blocking).
    pub fn shutdown(&self) {
        for entry in self.models().values() {
            for state in entry.versions.values() {
                if let VersionState::Ready(m) = state {
                    m.stop();
                }
            }
        }
    }
}

/// A hash of everything in a model directory that a reload depends on: the files' paths, sizes
/// and modification times (config, labels, every version directory).
pub fn fingerprint(dir: &Path) -> u64 {
    fingerprint_except(dir, None)
}

/// [`fingerprint`] without `config.pbtxt`.
fn fingerprint_files(dir: &Path) -> u64 {
    fingerprint_except(dir, Some("config.pbtxt"))
}

fn fingerprint_except(dir: &Path, skip: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    fn walk(
        p: &Path,
        h: &mut std::collections::hash_map::DefaultHasher,
        depth: usize,
        skip: Option<&str>,
    ) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if depth == 0 && skip.is_some_and(|s| e.file_name() == s) {
                continue;
            }
            let path = e.path();
            path.hash(h);
            if let Ok(md) = e.metadata() {
                if md.is_dir() {
                    if depth < 4 {
                        walk(&path, h, depth + 1, skip);
                    }
                } else {
                    md.len().hash(h);
                    md.modified().ok().hash(h);
                }
            }
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    walk(dir, &mut h, 0, skip);
    h.finish()
}

fn versions_list(entry: &ModelEntry) -> String {
    let v: Vec<String> = entry.versions.keys().map(u64::to_string).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// Loads one model; failures are recorded in the entry, never returned. Failure reasons reach
/// any client (the repository index, readiness errors), so paths in them are made relative to
/// the repository.
fn load_model(
    dir: &ModelDir,
    backend: &dyn Backend,
    opts: &LoadOptions,
    config_json: Option<&str>,
) -> ModelEntry {
    let mut entry = load_model_inner(dir, backend, opts, config_json);
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
) -> ModelEntry {
    let start = Instant::now();
    let name = dir.name.as_str();
    let (cfg, verified) = match prepare_config_from(
        dir,
        backend,
        opts.autocomplete,
        config_json,
        opts.verification.as_ref(),
    ) {
        Ok((c, verified)) => (Arc::new(c), verified),
        Err(e) => {
            tracing::error!(model = name, error = %e, "model failed to load");
            return ModelEntry::broken(name, e);
        }
    };
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
    let selected = match repository::select_versions(&policy, &repository::versions(&dir.path)) {
        Ok(v) if v.is_empty() => {
            return ModelEntry::broken(
                name,
                format!("no version directory (e.g. '1/') in {}", dir.path.display()),
            )
        }
        Ok(v) => v,
        Err(e) => return ModelEntry::broken(name, e),
    };
    let mut versions = BTreeMap::new();
    for v in selected {
        let observer = opts.metrics.as_ref().and_then(|m| m.observer(name, v));
        // The signature is checked before anything reads the version's files (once: the
        // version auto-complete read is checked already).
        let checked = match opts.verification.as_ref().filter(|_| verified != Some(v)) {
            Some(ver) => ver
                .check(&dir.path, &dir.name, v)
                .map_err(|why| Error::invalid(format!("integrity check failed: {why}"))),
            None => Ok(()),
        };
        let loaded =
            checked.and_then(|()| load_version(dir, v, &cfg, &labels, backend, observer, opts));
        let state = match loaded {
            Ok(m) => {
                tracing::info!(
                    model = name,
                    version = v,
                    engine = %m.engine,
                    secs = start.elapsed().as_secs_f64(),
                    "model version ready"
                );
                VersionState::Ready(Arc::new(m))
            }
            Err(e) => {
                tracing::error!(model = name, version = v, error = %e, "model version failed to load");
                VersionState::Unavailable(e.to_string())
            }
        };
        versions.insert(v, state);
    }
    ModelEntry {
        name: name.to_string(),
        versions,
        error: None,
    }
}

/// Reads, normalizes, auto-completes and validates one model's config (what loading does before
/// creating instances; the benchmark uses it to call a backend directly).
pub fn prepare_config(
    dir: &ModelDir,
    backend: &dyn Backend,
    autocomplete: bool,
) -> Result<ModelConfig> {
    prepare_config_from(dir, backend, autocomplete, None, None).map(|(cfg, _)| cfg)
}

/// As [`prepare_config`], from a load request's `config_json` when given; with `verification`,
/// the version auto-complete reads is checked first, and returned so that it is not hashed
/// twice.
fn prepare_config_from(
    dir: &ModelDir,
    backend: &dyn Backend,
    autocomplete: bool,
    config_json: Option<&str>,
    verification: Option<&crate::signing::Verification>,
) -> Result<(ModelConfig, Option<u64>)> {
    let mut verified = None;
    let name = dir.name.as_str();
    let mut cfg = match config_json {
        Some(json) => config::config_from_json(json)
            .map_err(|e| e.context(format!("model '{name}': 'config' parameter")))?,
        None => {
            let path = dir.path.join("config.pbtxt");
            let text = match std::fs::read_to_string(&path) {
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
    if autocomplete && cfg.is_onnx() {
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
    config::validate(&cfg, name, &dir.path)?;
    if config_json.is_some() && cfg.is_wasm() {
        // A config from the network may narrow the repository's sandbox, never widen it.
        let base = match std::fs::read_to_string(dir.path.join("config.pbtxt")) {
            Ok(text) => config::parse_pbtxt(name, &text)?,
            Err(_) => ModelConfig {
                name: name.to_string(),
                ..Default::default()
            },
        };
        wisp_plugin_runtime::limits::check_override_narrows(&base, &cfg, &dir.path)?;
    }
    Ok((cfg, verified))
}

/// Whether a model directory holds an ensemble (judged from its config text).
fn is_ensemble_dir(dir: &ModelDir) -> bool {
    std::fs::read_to_string(dir.path.join("config.pbtxt"))
        .ok()
        .and_then(|text| config::parse_pbtxt(&dir.name, &text).ok())
        .is_some_and(|c| c.is_ensemble())
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
    cfg: &Arc<ModelConfig>,
    labels: &HashMap<String, Arc<Vec<String>>>,
    backend: &dyn Backend,
    observer: Option<Observer>,
    opts: &LoadOptions,
) -> Result<ModelVersion> {
    let start = Instant::now();
    let file = model_file(&dir.path, version, cfg);
    if !cfg.is_ensemble() {
        repository::confine(
            &dir.path.join(version.to_string()),
            &cfg.default_model_filename,
        )
        .map_err(|why| Error::invalid(format!("default_model_filename: {why}")))?;
    }
    if !cfg.is_ensemble() && !file.is_file() {
        return Err(Error::not_found(format!(
            "model file {} not found",
            file.display()
        )));
    }
    let loaded = backend.load(cfg, &file)?;
    let cores = instance_cores(cfg, &opts.host_policies)?;
    let mut instances = (0..cfg.instance_count())
        .map(|i| loaded.new_instance(i).map(|inst| pin(inst, cores[i])))
        .collect::<Result<Vec<_>>>()?;
    warm_up(&dir.path, cfg, &mut instances)?;
    let scheduler = Arc::new(Scheduler::start(
        &dir.name,
        Policy::from_config(cfg),
        instances,
        observer,
    )?);
    let engine = loaded.engine().to_string();
    let composing = wisp_core::config::ensemble::steps(cfg)
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.model, s.version))
        .collect();
    Ok(ModelVersion {
        composing,
        loaded: Arc::from(loaded),
        name: dir.name.clone(),
        version,
        config: cfg.clone(),
        labels: labels.clone(),
        engine,
        load_secs: start.elapsed().as_secs_f64(),
        scheduler,
    })
}

/// The core each instance (in group order) is pinned to, from its group's `host_policy`.
fn instance_cores(
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

fn pin(instance: Box<dyn Instance>, core: Option<usize>) -> Box<dyn Instance> {
    match core {
        Some(c) => Box::new(crate::host_policy::Pinned::new(instance, c)),
        None => instance,
    }
}

/// Runs every `model_warmup` sample `count` times (at least once) on every instance, as
/// Triton does before a model is READY. Any failure fails the load.
fn warm_up(model_dir: &Path, cfg: &ModelConfig, instances: &mut [Box<dyn Instance>]) -> Result<()> {
    for sample in &cfg.model_warmup {
        let req = warmup_request(model_dir, cfg, sample)
            .map_err(|e| e.context(format!("warmup sample '{}'", sample.name)))?;
        for instance in instances.iter_mut() {
            for _ in 0..sample.count.max(1) {
                let mut t = ExecTiming::default();
                let mut out = instance.execute(std::slice::from_ref(&req), &mut t);
                match out.pop() {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        return Err(e.context(format!("warmup sample '{}' failed", sample.name)))
                    }
                    None => {
                        return Err(Error::internal(format!(
                            "warmup sample '{}': no response",
                            sample.name
                        )))
                    }
                }
            }
        }
        tracing::info!(model = %cfg.name, sample = %sample.name, "warmup done");
    }
    Ok(())
}

/// A tiny xorshift generator: random warm-up data needs no cryptographic quality.
fn pseudo_random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

fn warmup_request(
    model_dir: &Path,
    cfg: &ModelConfig,
    sample: &ModelWarmup,
) -> Result<InferRequest> {
    let mut inputs = Vec::new();
    for (name, w) in &sample.inputs {
        let c = cfg
            .input
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| Error::invalid(format!("'{name}' is not an input")))?;
        let type_name = if w.data_type.is_empty() {
            &c.data_type
        } else {
            &w.data_type
        };
        let dt = DataType::from_config_name(type_name)
            .ok_or_else(|| Error::invalid(format!("input '{name}': bad data_type {type_name}")))?;
        let dims = if w.dims.is_empty() { &c.dims } else { &w.dims };
        if dims.iter().any(|&d| d < 0) {
            return Err(Error::invalid(format!(
                "input '{name}': warmup dims {dims:?} must be concrete"
            )));
        }
        let mut shape: Vec<i64> = if cfg.batches() {
            vec![sample.batch_size.max(1) as i64]
        } else {
            Vec::new()
        };
        shape.extend(dims);
        let count = wisp_core::tensor::element_count(&shape)
            .map_err(|e| e.context(format!("input '{name}'")))?;
        let too_large = || {
            Error::invalid(format!(
                "input '{name}': warm-up data of shape {shape:?} is larger than {} bytes",
                config::bounds::MAX_WARMUP_BYTES
            ))
        };
        let elem_size = dt.size().unwrap_or(4);
        if count
            .checked_mul(elem_size)
            .is_none_or(|b| b as u64 > config::bounds::MAX_WARMUP_BYTES)
        {
            return Err(too_large());
        }
        let data: Vec<u8> = match (dt.size(), &w.input_data_file) {
            (_, Some(file)) => {
                let path = repository::confine(&model_dir.join("warmup"), file).map_err(|why| {
                    Error::invalid(format!("input '{name}': input_data_file {why}"))
                })?;
                let cannot_read = |e: std::io::Error| {
                    Error::invalid(format!(
                        "input '{name}': cannot read warmup/{file}: {}",
                        e.kind()
                    ))
                };
                // The file holds one batch item, repeated for the batch size. The bound is
                // checked on the file's size, before anything is read.
                let repeat = if cfg.batches() {
                    sample.batch_size.max(1) as u64
                } else {
                    1
                };
                let len = std::fs::metadata(&path).map_err(cannot_read)?.len();
                if len
                    .checked_mul(repeat)
                    .is_none_or(|b| b > config::bounds::MAX_WARMUP_BYTES)
                {
                    return Err(too_large());
                }
                let mut row = Vec::with_capacity(len as usize);
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(std::fs::File::open(&path).map_err(cannot_read)?, len),
                    &mut row,
                )
                .map_err(cannot_read)?;
                row.repeat(repeat as usize)
            }
            (None, None) => encode_bytes_elements(std::iter::repeat_n(&b""[..], count)),
            (Some(size), None) if w.random_data.is_some() => {
                let mut b = pseudo_random_bytes(count * size, 0x9E37_79B9_7F4A_7C15);
                if dt == DataType::Bool {
                    b.iter_mut().for_each(|x| *x &= 1);
                } else if matches!(
                    dt,
                    DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16
                ) {
                    // random bytes may spell NaN/inf: use small floats instead
                    b = (0..count)
                        .flat_map(|i| {
                            let v = ((i * 37 % 101) as f64) / 101.0;
                            match dt {
                                DataType::Fp16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                                DataType::Bf16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                                DataType::Fp32 => (v as f32).to_le_bytes().to_vec(),
                                _ => v.to_le_bytes().to_vec(),
                            }
                        })
                        .collect();
                }
                b
            }
            (Some(size), None) => vec![0u8; count * size],
        };
        inputs.push(Tensor::new(name.clone(), dt, shape, data.into())?);
    }
    Ok(InferRequest {
        id: format!("warmup:{}", sample.name),
        inputs,
        ..Default::default()
    })
}
