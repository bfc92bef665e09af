//! An in-place resize: when only `instance_group.count` changed, a model's instance pool grows
//! or shrinks under the same scheduler, keeping its queue and statistics.

use std::collections::BTreeMap;
use std::sync::Arc;

use wisp_core::config::ModelConfig;
use wisp_core::repository::{self, ModelDir};
use wisp_core::Result;

use super::entry::{ModelEntry, ModelVersion, VersionState};
use super::load::{instance_cores, pin, prepare_config_from};
use super::warmup::warm_up;
use super::Registry;

impl Registry {
    /// When only `instance_group.count` changed (same files, same config otherwise), grows or
    /// shrinks each version's instance pool in place: same queue, same statistics, no reload.
    /// `None` when a full reload is needed.
    pub(super) fn try_resize(
        &self,
        dir: &ModelDir,
        config_json: Option<&str>,
    ) -> Option<Result<()>> {
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
        .0
        .config;
        let without_counts = |c: &ModelConfig| {
            let mut c = c.clone();
            c.instance_group.iter_mut().for_each(|g| g.count = 0);
            c
        };
        if without_counts(&new_cfg) != without_counts(&first.config) || *new_cfg == *first.config {
            return None;
        }
        // A sequence's slot is on one instance: a stateful model reloads instead.
        if first.sequencer.is_some() {
            return None;
        }
        let policy = new_cfg.version_policy.clone().unwrap_or_default();
        let selected =
            repository::select_versions(&policy, &repository::versions(&dir.path)).ok()?;
        if selected != old.versions.keys().copied().collect::<Vec<_>>() {
            return None;
        }
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
                if let Err(e) = warm_up(&dir.path, &new_cfg, &m.signature, &mut added) {
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
                    signature: m.signature.clone(),
                    labels: m.labels.clone(),
                    engine: m.engine.clone(),
                    load_secs: m.load_secs,
                    loaded_at: m.loaded_at,
                    composing: m.composing.clone(),
                    params: m.params.clone(),
                    first_response: m.first_response.clone(),
                    gate: m.gate.clone(),
                    probe: m.probe.clone(),
                    scheduler: m.scheduler.clone(),
                    sequencer: m.sequencer.clone(),
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
                gated: Vec::new(),
            }),
        );
        Some(Ok(()))
    }
}
