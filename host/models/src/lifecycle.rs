//! The lifecycle half of [`Registry`]: loading (initial, explicit, with overrides, composing
//! steps first and refusing cycles), watching rollouts and rolling back, unloading (with
//! dependents) and polling the repository.

use super::*;

impl Registry {
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
        self.load_dirs(wanted);
        Ok(())
    }

    /// Loads `dirs`: plain models in parallel, then ensembles, each after the models it
    /// composes (loading an ensemble loads what it composes first), whatever the directory
    /// order.
    pub(crate) fn load_dirs(&self, dirs: Vec<ModelDir>) {
        let (ensembles, models): (Vec<ModelDir>, Vec<ModelDir>) =
            dirs.into_iter().partition(is_ensemble_dir);
        let queue = Mutex::new(models);
        std::thread::scope(|s| {
            for _ in 0..self.opts.threads.max(1) {
                s.spawn(|| loop {
                    let Some(dir) = queue.lock().expect("load queue").pop() else {
                        return;
                    };
                    let _ = self.load_dir(&dir, None, 0);
                });
            }
        });
        for dir in ensembles {
            // Already loaded from these files, as what an earlier ensemble composes.
            let current = self.marks(&dir.name).fingerprint == Some(fingerprint(&dir.path));
            if !(current
                && self
                    .models
                    .read()
                    .expect("registry lock")
                    .contains_key(&dir.name))
            {
                let _ = self.load_dir(&dir, None, 0);
            }
        }
    }

    pub(crate) fn find_dir(&self, name: &str) -> Result<ModelDir> {
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
    /// `config` load parameter). An ensemble's composing models that are not loaded are loaded
    /// first, as Triton does. On failure a model that was serving keeps serving, and the reason
    /// is reported by [`Registry::index`].
    pub fn load(&self, name: &str, config_json: Option<&str>) -> Result<()> {
        let dir = self.find_dir(name).map_err(|e| match e.kind() {
            // Triton's words for a load of a model its repositories do not hold
            wisp_core::ErrorKind::NotFound => Error::not_found(format!(
                "failed to load '{name}', failed to poll from model repository: \
                 there is no model directory '{name}' in the model repositories"
            )),
            _ => e,
        })?;
        self.load_dir(&dir, config_json, 0)?;
        self.slot(name).shipped.lock().expect("shipped").take();
        Ok(())
    }

    /// Loads, or reloads, `name` from files a load request shipped, written under `shipped`
    /// (`<shipped>/<name>/<version>/…`), with `config_json` as its config. The directory is kept
    /// while the model is served from it and removed when it unloads or loads from elsewhere;
    /// on failure it is removed at once and a model that was serving keeps serving.
    pub fn load_override(
        &self,
        name: &str,
        shipped: tempfile::TempDir,
        config_json: &str,
    ) -> Result<()> {
        let dir = ModelDir {
            name: name.to_string(),
            path: shipped.path().join(name),
        };
        self.load_dir(&dir, Some(config_json), 0)?;
        *self.slot(name).shipped.lock().expect("shipped") = Some(shipped);
        Ok(())
    }

    /// The models the ensemble `name` composes that are not loaded yet (none if it is not an
    /// ensemble or not in the repositories), read from `config_json` if given, else from its
    /// `config.pbtxt`: what loading it loads first.
    pub fn unloaded_steps(&self, name: &str, config_json: Option<&str>) -> Vec<String> {
        match self.find_dir(name) {
            Ok(dir) => self.steps_to_load(&dir, config_json),
            Err(_) => Vec::new(),
        }
    }

    pub(crate) fn steps_to_load(&self, dir: &ModelDir, config_json: Option<&str>) -> Vec<String> {
        self.config_steps(dir, config_json)
            .into_iter()
            .filter(|m| *m != dir.name && !self.is_loaded(m))
            .collect()
    }

    pub(crate) fn is_loaded(&self, name: &str) -> bool {
        self.models
            .read()
            .expect("registry lock")
            .contains_key(name)
    }

    /// Loads every composing model of the ensemble `dir` that is not loaded yet.
    pub(crate) fn load_composing(&self, dir: &ModelDir, config_json: Option<&str>, depth: usize) {
        for step in self.steps_to_load(dir, config_json) {
            // An earlier step (a nested ensemble) may have loaded it.
            if self.is_loaded(&step) {
                continue;
            }
            if let Ok(d) = self.find_dir(&step) {
                let _ = self.load_dir(&d, None, depth + 1);
            }
        }
    }

    pub(crate) fn load_dir(
        &self,
        dir: &ModelDir,
        config_json: Option<&str>,
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_ENSEMBLE_DEPTH {
            return Err(Error::invalid(format!(
                "failed to load '{}': ensembles nest deeper than {MAX_ENSEMBLE_DEPTH} levels",
                dir.name
            )));
        }
        // A load that would close an ensemble cycle is refused: it goes on as a load whose
        // entry is broken with that reason, loading nothing.
        let refused = self
            .cycle_through(dir, config_json)
            .map(|c| cycle::message(&c));
        if refused.is_none() {
            self.load_composing(dir, config_json, depth);
        }
        let slot = self.slot(&dir.name);
        let _guard = slot.lifecycle.lock().expect("model lock");
        let files = fingerprint_files(&dir.path);
        let old_files = {
            let mut marks = slot.marks.lock().expect("marks");
            marks.fingerprint = Some(fingerprint(&dir.path));
            marks.files.replace(files)
        };
        if refused.is_none() && old_files == Some(files) {
            match self.try_resize(dir, config_json) {
                None => {}
                Some(Ok(())) => {
                    slot.marks.lock().expect("marks").reload_error = None;
                    return Ok(());
                }
                Some(Err(e)) => {
                    let reason = format!(
                        "resize failed, previous instances still serving: {}",
                        e.message()
                    );
                    tracing::error!(model = %dir.name, %reason, "model resize failed");
                    slot.counts.lock().expect("counts").load_failures += 1;
                    slot.marks.lock().expect("marks").reload_error = Some(reason.clone());
                    return Err(Error::invalid(format!(
                        "failed to load '{}': {reason}",
                        dir.name
                    )));
                }
            }
        }
        // Versions rolled back from these very files stay out (a config override is a change).
        let withheld = match (&refused, config_json) {
            (Some(_), _) => None,
            (None, None) => self.withheld.check(&dir.name, &dir.path),
            (None, Some(_)) => {
                self.withheld.forget(&dir.name);
                None
            }
        };
        let skip = withheld.as_ref().map_or(&[][..], |r| &r.versions[..]);
        if !skip.is_empty() {
            tracing::warn!(model = %dir.name, versions = ?skip, "versions rolled back for breaching their SLA are withheld until their files change");
        }
        let previous = self
            .models
            .read()
            .expect("registry lock")
            .get(&dir.name)
            .cloned();
        let mut entry = match &refused {
            Some(why) => ModelEntry::broken(&dir.name, why),
            None => load_model(
                dir,
                self.backend.as_ref(),
                &self.opts,
                config_json,
                skip,
                previous.as_deref(),
            ),
        };
        drop(previous);
        self.record_gates(dir, &slot, &entry, withheld.as_ref(), config_json);
        let mut models = self.models.write().expect("registry lock");
        // Checked again against what is loaded now: a concurrent load of a step may have
        // closed a cycle since the check above. (What was loaded is dropped at the end, after
        // the registry lock.)
        let closed = cycle::find(&dir.name, |m| {
            let composing = match m == dir.name {
                true => entry.composing(),
                false => models.get(m).map(|e| e.composing()).unwrap_or_default(),
            };
            composing.into_iter().collect()
        });
        let _unloaded = closed.map(|c| {
            std::mem::replace(
                &mut entry,
                ModelEntry::broken(&dir.name, cycle::message(&c)),
            )
        });
        let old_ready = models.get(&dir.name).is_some_and(|e| e.is_ready());
        if !entry.is_ready() {
            slot.counts.lock().expect("counts").load_failures += 1;
        }
        if entry.is_ready() || !old_ready {
            let err = (!entry.is_ready()).then(|| entry.reason());
            let entry = Arc::new(entry);
            let previous = models.insert(dir.name.clone(), entry.clone());
            drop(models);
            self.start_watch(&dir.name, &slot, previous, &entry);
            {
                let mut marks = slot.marks.lock().expect("marks");
                marks.reload_error = None;
                marks.rolled_back = withheld.map(|r| {
                    let why = format!("{} (withheld until its files change)", r.reason);
                    (r.versions, why)
                });
            }
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
            slot.marks.lock().expect("marks").reload_error = Some(reason.clone());
            Err(Error::invalid(format!(
                "failed to load '{}': {reason}",
                dir.name
            )))
        }
    }

    /// Counts the gates `entry`'s load judged, and withholds the versions that failed while
    /// the model's files stay as they are (across restarts with `--state-dir`), so that a
    /// restart or a poll does not serve them ungated. A load from a config override is not
    /// remembered: its config is not the repository's.
    fn record_gates(
        &self,
        dir: &ModelDir,
        slot: &Slot,
        entry: &ModelEntry,
        withheld: Option<&withheld::Record>,
        config_json: Option<&str>,
    ) {
        let failed: Vec<&gate::Outcome> =
            entry.gated.iter().filter(|o| !o.report.passed()).collect();
        {
            let mut counts = slot.counts.lock().expect("counts");
            counts.gate_passed += (entry.gated.len() - failed.len()) as u64;
            counts.gate_failed += failed.len() as u64;
        }
        if failed.is_empty() || config_json.is_some() {
            return;
        }
        let mut versions: Vec<u64> = withheld.map(|r| r.versions.clone()).unwrap_or_default();
        versions.extend(failed.iter().map(|o| o.version));
        versions.sort_unstable();
        versions.dedup();
        let reason = failed
            .iter()
            .map(|o| format!("version {} {}", o.version, gate::failure_reason(&o.report)))
            .collect::<Vec<_>>()
            .join("; ");
        self.withheld
            .remember(&dir.name, &dir.path, versions, &reason);
    }

    /// The ensemble cycle that loading `dir` with `config_json` would close (see [`cycle`]):
    /// its own steps from that config; a loaded model's from what is loaded; a model not loaded
    /// yet from its `config.pbtxt`, as loading `dir` would load it.
    pub(crate) fn cycle_through(
        &self,
        dir: &ModelDir,
        config_json: Option<&str>,
    ) -> Option<Vec<String>> {
        let mut scan: Option<HashMap<String, ModelDir>> = None;
        cycle::find(&dir.name, |m| {
            if m == dir.name {
                return self.config_steps(dir, config_json);
            }
            if let Some(e) = self.models.read().expect("registry lock").get(m) {
                return e.composing().into_iter().collect();
            }
            let dirs = scan.get_or_insert_with(|| {
                repository::scan(&self.roots)
                    .map(|s| s.models.into_iter().map(|d| (d.name.clone(), d)).collect())
                    .unwrap_or_default()
            });
            dirs.get(m)
                .map(|d| self.config_steps(d, None))
                .unwrap_or_default()
        })
    }

    /// The models an ensemble's steps call, from `config_json` if given, else from its
    /// `config.pbtxt` (none for a model that is not an ensemble, or a config that does not
    /// parse, which its load reports).
    pub(crate) fn config_steps(&self, dir: &ModelDir, config_json: Option<&str>) -> Vec<String> {
        let cfg = match config_json {
            Some(json) => wisp_core::config::config_from_json(json).ok(),
            None => load::read_config(dir).ok(),
        };
        let steps = cfg
            .filter(|c| c.is_ensemble())
            .and_then(|c| wisp_core::config::ensemble::steps(&c).ok())
            .unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        steps
            .into_iter()
            .map(|s| s.model)
            .filter(|m| seen.insert(m.clone()))
            .collect()
    }

    /// After `entry` replaced `previous`: watches `entry` if it declares an SLA, holding the
    /// last version known good (`previous`, or what an unfinished watch held) for a rollback.
    pub(crate) fn start_watch(
        &self,
        name: &str,
        slot: &Slot,
        previous: Option<Arc<ModelEntry>>,
        entry: &ModelEntry,
    ) {
        let mut watch = slot.watch.lock().expect("watch");
        let good = match watch.take() {
            // The replaced version was still on trial: the one before it is the good one.
            Some(w) => Some(w.good),
            None => previous.filter(|p| p.is_ready()),
        };
        *watch = good
            .filter(|_| entry.is_ready())
            .and_then(|g| rollout::Watch::start(g, entry));
        if let Some(w) = watch.as_ref() {
            tracing::info!(
                model = name,
                window_secs = w.sla.window.as_secs(),
                "new version under SLA watch; the previous version stays loaded until the window passes"
            );
        }
    }

    /// Whether any reload is under SLA watch.
    pub fn watching(&self) -> bool {
        self.slots
            .lock()
            .expect("slots")
            .values()
            .any(|s| s.watch.lock().expect("watch").is_some())
    }

    /// Judges every reload under SLA watch (blocking; the server calls it a few times a
    /// second): swaps the previous version back in for a new one that breached its SLA, and
    /// releases the previous version once a new one has held its SLA through the window.
    pub fn watch_rollouts(&self) {
        let slots: Vec<(String, Arc<Slot>)> = self
            .slots
            .lock()
            .expect("slots")
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        for (name, slot) in slots {
            let verdict = match slot.watch.lock().expect("watch").as_ref() {
                None => continue,
                Some(w) => w.judge(std::time::Instant::now()),
            };
            match verdict {
                rollout::Verdict::Watching => {}
                rollout::Verdict::Keep(seen) => {
                    if slot.watch.lock().expect("watch").take().is_some() {
                        slot.counts.lock().expect("counts").kept += 1;
                        tracing::info!(
                            model = %name,
                            requests = seen.total,
                            failed = seen.failed,
                            p99_ms = seen.quantile(0.99).as_secs_f64() * 1000.0,
                            "new version held its SLA through the window; previous version released"
                        );
                    }
                }
                rollout::Verdict::RollBack(why) => self.roll_back(&name, &slot, &why),
            }
        }
    }

    /// Swaps the last good version of `name` back in for the one under watch. Skipped (to be
    /// judged again) while a load of the model is in progress, which replaces it anyway.
    pub(crate) fn roll_back(&self, name: &str, slot: &Slot, why: &str) {
        let Ok(_guard) = slot.lifecycle.try_lock() else {
            return;
        };
        let Some(watch) = slot.watch.lock().expect("watch").take() else {
            return;
        };
        let mut models = self.models.write().expect("registry lock");
        let Some(current) = models.get(name).cloned().filter(|c| watch.watches(c)) else {
            return;
        };
        models.insert(name.to_string(), watch.good.clone());
        drop(models);
        let ready = |e: &ModelEntry| -> Vec<u64> {
            e.versions
                .iter()
                .filter(|(_, s)| matches!(s, VersionState::Ready(_)))
                .map(|(v, _)| *v)
                .collect()
        };
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let (bad, good) = (ready(&current), ready(&watch.good));
        let reason = format!(
            "rolled back: the new version ({}) breached its SLA {:.1} s after the swap: {why}; \
             version {} restored",
            list(&bad),
            watch.started.elapsed().as_secs_f64(),
            list(&good)
        );
        tracing::error!(model = name, %reason, "SLA breach: previous version swapped back in");
        let gone: Vec<u64> = bad.into_iter().filter(|v| !good.contains(v)).collect();
        // Remembered (across restarts with --state-dir) while the files are the ones that
        // loaded; a rollback within one version number leaves nothing on disk to withhold.
        let loaded_from = slot.marks.lock().expect("marks").fingerprint;
        let shipped = slot.shipped.lock().expect("shipped").is_some();
        if let (false, false, Ok(dir)) = (gone.is_empty(), shipped, self.find_dir(name)) {
            if loaded_from == Some(fingerprint(&dir.path)) {
                self.withheld
                    .remember(name, &dir.path, gone.clone(), &reason);
            }
        }
        {
            let mut marks = slot.marks.lock().expect("marks");
            marks.reload_error = Some(reason.clone());
            marks.rolled_back = Some((gone, reason));
            // The next load must build afresh, not resize the restored version in place.
            marks.files = None;
        }
        slot.counts.lock().expect("counts").rollbacks += 1;
    }

    /// Load failures, rollbacks and kept versions per model that has any (or is under watch,
    /// with `true`).
    pub fn lifecycle_counts(&self) -> Vec<(String, rollout::LifecycleCounts, bool)> {
        let slots = self.slots.lock().expect("slots");
        let mut out: Vec<_> = slots
            .iter()
            .map(|(n, s)| {
                let counts = *s.counts.lock().expect("counts");
                let watching = s.watch.lock().expect("watch").is_some();
                (n.clone(), counts, watching)
            })
            .filter(|(_, c, w)| *w || *c != rollout::LifecycleCounts::default())
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Unloads a model: it stops taking requests at once; those already accepted finish.
    pub fn unload(&self, name: &str) -> Result<()> {
        let slot = self.slot(name);
        let _guard = slot.lifecycle.lock().expect("model lock");
        let removed = self.models.write().expect("registry lock").remove(name);
        *slot.marks.lock().expect("marks") = Marks::default();
        slot.shipped.lock().expect("shipped").take();
        slot.watch.lock().expect("watch").take();
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

    /// Unloads `name` and then, as Triton's `unload_dependents` does, each model it composes
    /// (recursively) that no model still loaded composes.
    pub fn unload_with_dependents(&self, name: &str) -> Result<()> {
        self.unload_dependents_depth(name, 0)
    }

    pub(crate) fn unload_dependents_depth(&self, name: &str, depth: usize) -> Result<()> {
        let composing: Vec<String> = self
            .entry(name)
            .map(|e| e.composing().into_iter().collect())
            .unwrap_or_default();
        self.unload(name)?;
        if depth >= MAX_ENSEMBLE_DEPTH {
            return Ok(());
        }
        for model in composing {
            let still_used = self
                .models()
                .values()
                .any(|e| e.composing().contains(&model));
            if !still_used {
                self.unload_dependents_depth(&model, depth + 1)?;
            }
        }
        Ok(())
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
        let changed: Vec<ModelDir> = scan
            .models
            .into_iter()
            .filter(|dir| self.marks(&dir.name).fingerprint != Some(fingerprint(&dir.path)))
            .inspect(|dir| {
                tracing::info!(model = %dir.name, "repository change detected; loading");
            })
            .collect();
        self.load_dirs(changed);
    }
}
