//! `wisp-models`, model lifecycle: every model of the repositories is loaded at start-up (in parallel), each
//! version behind its own scheduler. A broken model or version is kept as UNAVAILABLE with its
//! reason and never stops the others from loading.
//!
//! - [`entry`]: what a loaded model is ([`ModelVersion`], [`ModelEntry`]);
//! - [`load`]: preparing a config and loading one model's versions;
//! - `resize`: growing or shrinking an instance pool in place;
//! - [`warmup`]: `model_warmup` samples;
//! - [`gate`]: a new version's answers and latency checked against the version it replaces
//!   before it serves;
//! - [`rollout`]: the SLA watch after a reload, and the swap back on a breach;
//! - [`fingerprint`](mod@fingerprint): what poll mode compares;
//! - [`ensemble`], [`caller`]: the ensemble backend, and the way plugins and ensemble steps
//!   call models back through the registry (the server hands the registry its backends:
//!   ONNX, wasm and this ensemble one, behind `wisp_core::backend::Backend`);
//! - [`host_policy`]: where each instance's thread runs (`--host-policy`);
//! - [`signing`]: signed model versions, checked before load (`--model-verify-key`).
//!
//! Nothing here knows about HTTP, gRPC or the Prometheus exporter: per-request observers come in
//! through [`Observers`].

pub mod caller;
mod cycle;
pub mod ensemble;
pub mod entry;
pub mod fingerprint;
pub mod first_response;
pub mod gate;
pub mod host_policy;
mod lifecycle;
pub mod load;
pub mod rate_limit;
mod resize;
pub mod rollout;
pub mod signing;
#[cfg(test)]
mod tests;
pub mod warmup;
pub mod withheld;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use wisp_core::backend::Backend;
use wisp_core::repository::{self, ModelDir};
use wisp_core::{Error, Result};

pub use entry::{IndexEntry, ModelEntry, ModelVersion, VersionState};
pub use fingerprint::fingerprint;
pub use load::{model_file, prepare_config, LoadOptions, Observers};

use fingerprint::fingerprint_files;
use load::{is_ensemble_dir, load_model};

/// Most levels of ensembles inside ensembles that loading or a readiness check follows.
pub const MAX_ENSEMBLE_DEPTH: usize = 16;

/// What the registry keeps for one model name besides its entry, created on first use.
#[derive(Default)]
struct Slot {
    /// Serializes load, reload and unload of the model.
    lifecycle: Mutex<()>,
    /// Bookkeeping that poll and the index read without waiting for a load in progress.
    marks: Mutex<Marks>,
    /// The server-owned directory of files a load request shipped (`file:` parameters) that
    /// the model was loaded from; removed when the model unloads or loads from elsewhere.
    shipped: Mutex<Option<tempfile::TempDir>>,
    /// The reload under SLA watch, holding the version it replaced.
    watch: Mutex<Option<rollout::Watch>>,
    /// Load failures, rollbacks and kept versions, for the metrics exporter.
    counts: Mutex<rollout::LifecycleCounts>,
}

#[derive(Debug, Default, Clone)]
struct Marks {
    /// Why the last reload of a still-serving model failed.
    reload_error: Option<String>,
    /// The repository fingerprint at the last load attempt (poll mode).
    fingerprint: Option<u64>,
    /// The same without `config.pbtxt`: unchanged model files allow an in-place resize.
    files: Option<u64>,
    /// The versions last swapped back out for breaching their SLA, and why.
    rolled_back: Option<(Vec<u64>, String)>,
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
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Versions rolled back for breaching their SLA, kept out while their files are unchanged.
    withheld: withheld::Withheld,
}

impl Registry {
    /// An empty registry over `roots`.
    pub fn new(
        roots: Vec<std::path::PathBuf>,
        backend: Arc<dyn Backend>,
        opts: LoadOptions,
    ) -> Self {
        Registry {
            withheld: withheld::Withheld::open(opts.state_dir.as_deref()),
            roots,
            backend,
            opts,
            models: RwLock::new(BTreeMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, name: &str) -> Arc<Slot> {
        self.slots
            .lock()
            .expect("slots")
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// A copy of `name`'s bookkeeping (empty for a model never loaded).
    fn marks(&self, name: &str) -> Marks {
        let slot = self.slots.lock().expect("slots").get(name).cloned();
        slot.map(|s| s.marks.lock().expect("marks").clone())
            .unwrap_or_default()
    }

    /// What the gate measured for each version the model's current entry judged when it
    /// loaded (empty when it judged none, or the model is not loaded).
    pub fn gate_outcomes(&self, name: &str) -> Vec<gate::Outcome> {
        self.models
            .read()
            .expect("registry lock")
            .get(name)
            .map(|e| e.gated.clone())
            .unwrap_or_default()
    }

    /// The repository index: every model of the repositories, loaded or not.
    pub fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>> {
        let scan = repository::scan(&self.roots)?;
        let models = self.models.read().expect("registry lock");
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
            let marks = self.marks(&name);
            let ready_reason = marks
                .reload_error
                .clone()
                .or_else(|| self.watch_status(&name))
                .unwrap_or_default();
            for (v, state) in &entry.versions {
                let (st, reason) = match state {
                    VersionState::Ready(_) => ("READY", ready_reason.clone()),
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
            // Versions swapped back out for breaching their SLA stay visible, with why.
            if let Some((versions, why)) = marks.rolled_back.filter(|_| !ready_only) {
                for v in versions
                    .into_iter()
                    .filter(|v| !entry.versions.contains_key(v))
                {
                    out.push(IndexEntry {
                        name: name.clone(),
                        version: Some(v),
                        state: "UNAVAILABLE",
                        reason: why.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// What the index says of a model under SLA watch.
    fn watch_status(&self, name: &str) -> Option<String> {
        let slot = self.slots.lock().expect("slots").get(name).cloned()?;
        let watch = slot.watch.lock().expect("watch");
        let w = watch.as_ref()?;
        let left = w.sla.window.saturating_sub(w.started.elapsed());
        Some(format!(
            "under SLA watch for {} s more; the previous version stays loaded for rollback",
            left.as_secs().max(1)
        ))
    }

    /// A snapshot of every loaded (or failed) model, by name.
    pub fn models(&self) -> BTreeMap<String, Arc<ModelEntry>> {
        self.models.read().expect("registry lock").clone()
    }

    /// The longest execution in progress on any instance of a ready, non-ensemble model
    /// version: which one and for how long (`None` when every instance waits). Ensembles are
    /// left out: their instances wait on their steps, which show here themselves.
    pub fn longest_execution(&self) -> Option<(String, u64, std::time::Duration)> {
        let mut longest = None;
        for (name, entry) in self.models() {
            for state in entry.versions.values() {
                let VersionState::Ready(m) = state else {
                    continue;
                };
                if m.config.is_ensemble() {
                    continue;
                }
                if let Some(took) = m.scheduler.longest_execution() {
                    if longest.as_ref().is_none_or(|(_, _, t)| took > *t) {
                        longest = Some((name.clone(), m.version, took));
                    }
                }
            }
        }
        longest
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
                        "Request for unknown model: '{name}' version {n} is not found: requested model \
                         version is not available for model '{name}' (served: {})",
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
        if !m.config.is_ensemble() || depth > MAX_ENSEMBLE_DEPTH {
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

fn versions_list(entry: &ModelEntry) -> String {
    let v: Vec<String> = entry.versions.keys().map(u64::to_string).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
