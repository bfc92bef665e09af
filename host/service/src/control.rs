//! Changing the server: model load and unload with the control-mode and override policy, and
//! the logging extension. The refusals (and their words) are written once, here.

use wisp_core::{Error, Result};

use super::Service;
use crate::logging::LogSettings;
use crate::ControlMode;

/// Where a load or unload request came from: the control plane is off by default on the
/// network front ends in explicit mode (see [`NetworkControl`]), never for the embedding API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The HTTP front end.
    Http,
    /// The gRPC front end.
    Grpc,
    /// The process that embeds Wisp (Rust or Python); it chose the repository itself.
    InProcess,
}

/// Which network front ends may load and unload models in explicit mode. A front end's control
/// plane is open when `--allow-unauthenticated-control` is given or when its restricted-API
/// flag puts the `model-repository` group behind a header (only callers with the key reach
/// the service then); otherwise a network load lets anyone who can reach the port run code of
/// their choosing (an ONNX file, a config override), so it is refused.
#[derive(Debug, Clone, Copy, Default)]
pub struct NetworkControl {
    /// HTTP may load and unload.
    pub http: bool,
    /// gRPC may load and unload.
    pub grpc: bool,
}

/// A load request, as the front end parsed it.
#[derive(Debug)]
pub struct LoadRequest {
    /// Where the request came from.
    pub caller: Caller,
    /// `repository_name` (not supported when non-empty).
    pub repository: String,
    /// A JSON `ModelConfig` replacing `config.pbtxt` (may only narrow a plugin's sandbox).
    pub config: Option<String>,
    /// Model files from `file:<path>` parameters (path inside the model directory, content).
    pub files: Vec<(String, Vec<u8>)>,
}

/// Files one load request may ship, at most.
pub const MAX_OVERRIDE_FILES: usize = 256;
/// Bytes one load request may ship in files, at most.
pub const MAX_OVERRIDE_BYTES: usize = 256 << 20;

/// A `file:` path, checked: relative, inside a version directory (`<digits>/…`), made of plain
/// names only. The model's config comes from the `config` parameter, never from a file.
fn override_path(path: &str) -> Result<std::path::PathBuf> {
    let bad = |why: &str| Error::invalid(format!("parameter 'file:{path}': {why}"));
    if path.is_empty() || path.len() > 1024 {
        return Err(bad("the path must have 1 to 1024 bytes"));
    }
    if path
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == ".." || seg.contains('\0'))
    {
        return Err(bad("the path must be relative, without '.' or '..'"));
    }
    if path.split('/').any(|seg| seg.len() > 255) {
        return Err(bad("each name in the path must have at most 255 bytes"));
    }
    let p = std::path::Path::new(path);
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(n) => parts.push(n),
            _ => return Err(bad("the path must be relative, without '.' or '..'")),
        }
    }
    if parts.len() < 2 || parts.len() > 8 {
        return Err(bad(
            "files go inside a version directory, such as 'file:1/model.onnx'",
        ));
    }
    let version = parts[0].to_str().unwrap_or("");
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) || version.len() > 19 {
        return Err(bad(
            "files go inside a version directory, such as 'file:1/model.onnx'",
        ));
    }
    Ok(parts.iter().collect())
}

/// Writes a load request's files under a fresh server-owned directory, as
/// `<dir>/<model>/<path>`; the directory goes away when the returned handle is dropped.
fn write_override(model: &str, files: &[(String, Vec<u8>)]) -> Result<tempfile::TempDir> {
    if files.len() > MAX_OVERRIDE_FILES {
        return Err(Error::invalid(format!(
            "a load request may carry at most {MAX_OVERRIDE_FILES} 'file:' parameters, got {}",
            files.len()
        )));
    }
    let total = files
        .iter()
        .fold(0usize, |sum, (_, data)| sum.saturating_add(data.len()));
    if total > MAX_OVERRIDE_BYTES {
        return Err(Error::too_large(format!(
            "the 'file:' parameters hold {total} bytes, more than {MAX_OVERRIDE_BYTES}"
        )));
    }
    let paths = files
        .iter()
        .map(|(p, _)| override_path(p))
        .collect::<Result<Vec<_>>>()?;
    let dir = tempfile::Builder::new()
        .prefix("wisp-override-")
        .tempdir()
        .map_err(|e| {
            Error::internal(format!(
                "cannot create a directory for 'file:' parameters: {e}"
            ))
        })?;
    let root = dir.path().join(model);
    for (path, (name, data)) in paths.iter().zip(files) {
        let target = root.join(path);
        let written = target
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&target, data));
        written.map_err(|e| Error::internal(format!("cannot write 'file:{name}': {e}")))?;
    }
    Ok(dir)
}

impl LoadRequest {
    /// A plain load (no override, no files) from `caller`.
    pub fn plain(caller: Caller) -> Self {
        LoadRequest {
            caller,
            repository: String::new(),
            config: None,
            files: Vec::new(),
        }
    }
}

impl Service {
    /// Refuses repository control unless the server runs in explicit mode and the caller's
    /// front end has its control plane open (and for named repositories, which Wisp does not
    /// support). The front ends call it before they read a load request's body, so that a
    /// refused caller costs nothing to parse; [`Service::load`] and [`Service::unload`] check
    /// it again.
    pub fn check_control(&self, repository: &str, caller: Caller) -> Result<()> {
        if !repository.is_empty() {
            return Err(Error::unsupported(
                "'repository_name' specification is not supported",
            ));
        }
        if self.control_mode != ControlMode::Explicit {
            // Triton's message (it says so in every mode but explicit), then ours.
            return Err(Error::unavailable(format!(
                "explicit model load / unload is not allowed if polling is enabled (model control mode is '{}'; start with --model-control-mode explicit)",
                format!("{:?}", self.control_mode).to_lowercase()
            )));
        }
        let (open, flag) = match caller {
            Caller::InProcess => (true, ""),
            Caller::Http => (self.network_control.http, "--http-restricted-api"),
            Caller::Grpc => (self.network_control.grpc, "--grpc-restricted-protocol"),
        };
        if !open {
            return Err(Error::forbidden(format!(
                "model load / unload over the network is off by default: put it behind a key with {flag} model-repository:<header>=<value>, or start with --allow-unauthenticated-control"
            )));
        }
        Ok(())
    }

    /// Loads or reloads `model` (off the async workers).
    pub async fn load(&self, model: &str, req: LoadRequest) -> Result<()> {
        self.check_control(&req.repository, req.caller)?;
        check_load_name(model)?;
        if req.config.is_some() && self.signed_only {
            return Err(Error::invalid(
                "a load request may not override a model's config when --require-signed-models is set (the signed config.pbtxt is what loads)",
            ));
        }
        let (registry, model) = (self.registry.clone(), model.to_string());
        if req.files.is_empty() {
            self.sync_for_load(&model, req.config.as_deref()).await;
            return tokio::task::spawn_blocking(move || {
                registry.load(&model, req.config.as_deref())
            })
            .await
            .map_err(|_| Error::internal("model load panicked"))?;
        }
        if self.signed_only {
            return Err(Error::invalid(
                "a load request may not ship model files ('file:' parameters) when --require-signed-models is set",
            ));
        }
        let Some(config) = req.config else {
            return Err(Error::invalid(
                "a load request with 'file:' parameters must also give the model's 'config'",
            ));
        };
        if !wisp_core::repository::is_model_name(&model) {
            return Err(Error::invalid(format!(
                "'{}' cannot name a model directory",
                model.escape_debug()
            )));
        }
        tokio::task::spawn_blocking(move || {
            let dir = write_override(&model, &req.files)?;
            registry.load_override(&model, dir, &config)
        })
        .await
        .map_err(|_| Error::internal("model load panicked"))?
    }

    /// Brings `model`'s mirrored copy up to date from object storage before it loads, as Triton
    /// fetches a cloud model on load; for an ensemble, also the copies of the models it composes
    /// that are not loaded yet (which its load loads), nested ensembles' to the loader's depth.
    async fn sync_for_load(&self, model: &str, config: Option<&str>) {
        if self.remotes.is_empty() {
            return;
        }
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![(model.to_string(), config.map(str::to_string), 0)];
        while let Some((name, config, depth)) = todo.pop() {
            if depth > crate::models::MAX_ENSEMBLE_DEPTH || !seen.insert(name.clone()) {
                continue;
            }
            for source in &self.remotes {
                source.sync_model(&name).await;
            }
            let registry = self.registry.clone();
            let steps = tokio::task::spawn_blocking(move || {
                registry.unloaded_steps(&name, config.as_deref())
            })
            .await
            .unwrap_or_default();
            todo.extend(steps.into_iter().map(|s| (s, None, depth + 1)));
        }
    }

    /// Unloads `model` (off the async workers); with `dependents`, also the models it composes
    /// that nothing else loaded uses (Triton's `unload_dependents`).
    pub async fn unload(
        &self,
        model: &str,
        repository: &str,
        dependents: bool,
        caller: Caller,
    ) -> Result<()> {
        self.check_control(repository, caller)?;
        let (registry, model) = (self.registry.clone(), model.to_string());
        tokio::task::spawn_blocking(move || {
            if dependents {
                registry.unload_with_dependents(&model)
            } else {
                registry.unload(&model)
            }
        })
        .await
        .map_err(|_| Error::internal("model unload panicked"))?
    }

    /// The log settings, after applying `update` (all or nothing) when it is not empty.
    pub fn log_settings(
        &self,
        update: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<LogSettings> {
        if update.is_empty() {
            Ok(self.logging.get())
        } else {
            self.logging.update(update)
        }
    }
}

/// A load request's model name as Triton checks it, in its words: not empty or blank, and one
/// plain path component: no separator, and not `.` or `..` even with blanks around them. Dots
/// inside a name (`model..1`, `...`) name a directory like any other, as in Triton.
fn check_load_name(model: &str) -> Result<()> {
    if model.trim().is_empty() {
        return Err(Error::invalid(
            "Model name cannot be empty. Please enter a valid name to deploy.",
        ));
    }
    if model.contains(['/', '\\', '\0']) || matches!(model.trim(), "." | "..") {
        return Err(Error::invalid(format!(
            "model name must not contain path traversal characters: '{}'",
            model.escape_debug()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Triton's words for a load request's bad names, before anything else is looked at.
    #[test]
    fn load_names_are_checked_in_tritons_words() {
        for blank in ["", "  ", "\t"] {
            let e = check_load_name(blank).unwrap_err();
            assert_eq!(
                e.message(),
                "Model name cannot be empty. Please enter a valid name to deploy."
            );
        }
        for bad in [
            "..", "../etc", "a/b", "a\\b", "x/../y", "model/", " ..", ".. ", ".", "a\0b",
        ] {
            let e = check_load_name(bad).unwrap_err();
            assert!(
                e.message()
                    .starts_with("model name must not contain path traversal characters"),
                "{bad}: {e}"
            );
        }
        for good in ["add_sub", "model.version1", "...", "..my_model", "model..1"] {
            assert!(check_load_name(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn override_paths_stay_in_version_directories() {
        assert_eq!(
            override_path("1/model.onnx").unwrap(),
            std::path::PathBuf::from("1/model.onnx")
        );
        assert!(override_path("12/sub/model.onnx").is_ok());
        for bad in [
            "",
            "model.onnx",
            "config.pbtxt",
            "/1/model.onnx",
            "1/../../x",
            "../1/x",
            "1/./x",
            "a/model.onnx",
            "1",
            "1/",
        ] {
            assert!(override_path(bad).is_err(), "{bad}");
        }
        // A name the file system would refuse (ENAMETOOLONG) is the client's error, named.
        let long = format!("1/{}", "a".repeat(300));
        let e = override_path(&long).unwrap_err();
        assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg);
        assert!(e.message().contains("255 bytes"), "{e}");
        assert!(override_path(&format!("1/{}", "a".repeat(255))).is_ok());
    }

    #[test]
    fn override_files_are_written_under_a_fresh_directory_and_bounded() {
        let dir = write_override("m", &[("1/model.onnx".into(), b"onnx".to_vec())]).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("m/1/model.onnx")).unwrap(),
            b"onnx"
        );
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "removed with its handle");
        let many: Vec<(String, Vec<u8>)> = (0..=MAX_OVERRIDE_FILES)
            .map(|i| (format!("1/f{i}"), Vec::new()))
            .collect();
        assert!(write_override("m", &many).is_err());
        let big = vec![(
            "1/model.onnx".to_string(),
            vec![0u8; MAX_OVERRIDE_BYTES + 1],
        )];
        assert_eq!(
            write_override("m", &big).unwrap_err().kind(),
            wisp_core::ErrorKind::TooLarge
        );
    }
}
