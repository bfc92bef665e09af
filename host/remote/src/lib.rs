//! Model repositories on object storage (`--model-repository s3://bucket/prefix`), mirrored
//! into a local directory that the registry serves like any other repository.
//!
//! A sync lists the prefix, groups objects by model (the first path segment under it), and
//! downloads each model whose objects changed (by ETag, else last-modified, and size) into a
//! staging directory beside the mirror. Only a model that downloaded whole replaces its mirrored
//! directory, by rename; one that fails keeps the mirrored copy (and so the serving version),
//! and is tried again at the next sync. Models gone from the bucket leave the mirror. The
//! registry then loads what changed with its usual load-beside-then-swap, so a version that is
//! partial in the bucket fails its own load and never replaces the serving one.

mod owned;
mod source;
#[cfg(test)]
mod tests;
mod top;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path as ObjectPath;
use object_store::ClientOptions;
use object_store::{ObjectStore, ObjectStoreExt};
use wisp_core::{Error, Result};

/// At most this many objects under one repository prefix.
pub const MAX_OBJECTS: usize = 100_000;
/// At most this many bytes in one model's objects.
pub const MAX_MODEL_BYTES: u64 = 16 << 30;

/// A listing: every object by model, and the models that could not be listed (kept as they are
/// mirrored, neither updated nor removed).
#[derive(Debug, Default)]
struct Listing {
    models: BTreeMap<String, Vec<Listed>>,
    skipped: std::collections::BTreeSet<String>,
}

/// One object as listed: its path under the prefix, and what tells a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    rel: Vec<String>,
    tag: String,
    size: u64,
}

/// Why a listing failed: a key the store's client cannot parse as a path (which fails its whole
/// page), or anything else (credentials, network, no such bucket).
enum ListError {
    BadKey(Error),
    Other(Error),
}

impl ListError {
    fn into_error(self) -> Error {
        match self {
            ListError::BadKey(e) | ListError::Other(e) => e,
        }
    }
}

/// A repository on object storage and its local mirror.
pub struct RemoteRepo {
    url: String,
    bucket: Bucket,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    local: PathBuf,
    /// Per model, the listing its mirrored copy was downloaded from.
    synced: Mutex<BTreeMap<String, Vec<Listed>>>,
    /// One sync at a time (the poller's and explicit loads').
    gate: tokio::sync::Mutex<()>,
}

impl RemoteRepo {
    /// The repository at `url`, mirrored under `cache_root`. The URL forms, and where each takes
    /// its credentials from, are in docs/serving.md ("Changing models on a running server").
    pub fn new(url: &str, cache_root: &Path) -> Result<RemoteRepo> {
        let Opened {
            store,
            bucket,
            prefix,
        } = open(url, &|k| std::env::var(k))?;
        let digest = {
            use sha2::Digest;
            wisp_service::models::signing::hex(&sha2::Sha256::digest(url.as_bytes()))
        };
        owned::own_dir(cache_root)?;
        let local = cache_root.join(format!("{}-{}", sanitize(&bucket.name), &digest[..16]));
        std::fs::create_dir_all(&local).map_err(|e| {
            Error::internal(format!(
                "model repository '{url}': cannot create its mirror {}: {e}",
                local.display()
            ))
        })?;
        Ok(RemoteRepo {
            url: url.to_string(),
            bucket,
            store,
            prefix: ObjectPath::from(prefix.trim_matches('/')),
            local,
            synced: Mutex::new(BTreeMap::new()),
            gate: tokio::sync::Mutex::new(()),
        })
    }

    /// The local directory the registry serves.
    pub fn local(&self) -> &Path {
        &self.local
    }

    /// Brings the mirror up to date; returns the models it changed. An error to list (wrong
    /// credentials, no such bucket) fails the whole sync; a model that fails to download is
    /// logged and left as it was.
    pub async fn sync(&self) -> Result<Vec<String>> {
        let _one_at_a_time = self.gate.lock().await;
        let listing = match self.list(None).await {
            Err(ListError::BadKey(e)) => {
                // The store's client refuses a whole listing page over one key it cannot parse
                // (`a/../b`): list model by model, so that one model's bad key costs only that
                // model's sync.
                tracing::error!(repository = %self.url, error = %e, "a key cannot be a path; listing model by model");
                self.list_by_model().await?
            }
            other => Listing {
                models: other.map_err(ListError::into_error)?,
                skipped: Default::default(),
            },
        };
        self.reconcile(listing, None).await
    }

    /// Brings one model's mirrored copy up to date (an explicit-mode load); returns whether it
    /// changed. A name that cannot be a model directory syncs nothing, and the load that follows
    /// reports it.
    pub async fn sync_model(&self, model: &str) -> Result<bool> {
        if !wisp_core::repository::is_model_name(model) {
            return Ok(false);
        }
        let _one_at_a_time = self.gate.lock().await;
        let models = self
            .list(Some(model))
            .await
            .map_err(ListError::into_error)?;
        let listing = Listing {
            models,
            skipped: Default::default(),
        };
        Ok(!self.reconcile(listing, Some(model)).await?.is_empty())
    }

    /// Downloads what `listing` shows changed and removes what it shows gone, among all models
    /// or `only` one.
    async fn reconcile(&self, listing: Listing, only: Option<&str>) -> Result<Vec<String>> {
        let Listing {
            models: listing,
            skipped,
        } = listing;
        let mut changed = Vec::new();
        let previous = self.synced.lock().expect("synced").clone();
        for (model, objects) in &listing {
            let on_disk = self.local.join(model).is_dir();
            if on_disk && previous.get(model) == Some(objects) {
                continue;
            }
            match self.download(model, objects).await {
                Ok(()) => {
                    self.synced
                        .lock()
                        .expect("synced")
                        .insert(model.clone(), objects.clone());
                    changed.push(model.clone());
                }
                Err(e) => tracing::error!(
                    repository = %self.url, model, error = %e,
                    "model download failed; the mirrored copy stays"
                ),
            }
        }
        let gone = previous.keys().filter(|m| {
            only.is_none_or(|o| o == m.as_str())
                && !listing.contains_key(*m)
                && !skipped.contains(*m)
        });
        for model in gone {
            let _ = std::fs::remove_dir_all(self.local.join(model));
            self.synced.lock().expect("synced").remove(model);
            changed.push(model.clone());
        }
        // A first sync also clears models mirrored by an earlier run but gone since.
        if previous.is_empty() && only.is_none() {
            for entry in std::fs::read_dir(&self.local)
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !listing.contains_key(&name)
                    && !skipped.contains(&name)
                    && !name.starts_with('.')
                {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        if !changed.is_empty() {
            tracing::info!(repository = %self.url, models = ?changed, "object-store repository synced");
        }
        Ok(changed)
    }

    /// The model directories under the prefix (one delimiter listing), then each model's
    /// objects on their own; a model whose listing fails is skipped and reported.
    async fn list_by_model(&self) -> Result<Listing> {
        let mut listing = Listing::default();
        for model in self.model_dirs().await? {
            let model = model.as_str();
            match self.list(Some(model)).await {
                Ok(found) => listing.models.extend(found),
                Err(e) => {
                    tracing::error!(
                        repository = %self.url, model, error = %e.into_error(),
                        "model skipped: its objects cannot be listed; the mirrored copy stays"
                    );
                    listing.skipped.insert(model.to_string());
                }
            }
        }
        Ok(listing)
    }

    fn list_failed(&self, e: object_store::Error) -> Error {
        Error::unavailable(format!(
            "cannot list model repository '{}' ({} '{}'): {e}",
            self.url, self.bucket.kind, self.bucket.name
        ))
    }

    /// Every object under the prefix (or `only` that model's directory under it), by model.
    async fn list(
        &self,
        only: Option<&str>,
    ) -> std::result::Result<BTreeMap<String, Vec<Listed>>, ListError> {
        let under = match only {
            Some(model) => Some(self.prefix.clone().join(model)),
            None => (!self.prefix.as_ref().is_empty()).then(|| self.prefix.clone()),
        };
        let mut stream = self.store.list(under.as_ref());
        let mut out: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        let mut count = 0usize;
        while let Some(meta) = stream.try_next().await.map_err(|e| match e {
            object_store::Error::InvalidPath { .. } => ListError::BadKey(self.list_failed(e)),
            e => ListError::Other(self.list_failed(e)),
        })? {
            count += 1;
            if count > MAX_OBJECTS {
                return Err(ListError::Other(Error::invalid(format!(
                    "model repository '{}' holds more than {MAX_OBJECTS} objects",
                    self.url
                ))));
            }
            let Some(rel) = meta.location.prefix_match(&self.prefix) else {
                continue;
            };
            let rel: Vec<String> = rel.map(|p| p.as_ref().to_string()).collect();
            // Plain names only: a key cannot place a file outside the mirror.
            if rel.len() < 2
                || rel
                    .iter()
                    .any(|s| s.is_empty() || s == "." || s == ".." || s.contains('\\'))
                || rel[0].starts_with('.')
            {
                continue;
            }
            let tag = meta
                .e_tag
                .clone()
                .unwrap_or_else(|| meta.last_modified.to_rfc3339());
            out.entry(rel[0].clone()).or_default().push(Listed {
                rel,
                tag,
                size: meta.size,
            });
        }
        for objects in out.values_mut() {
            objects.sort_by(|a, b| a.rel.cmp(&b.rel));
        }
        Ok(out)
    }

    /// Downloads `model`'s objects into a staging directory, then renames it into place.
    async fn download(&self, model: &str, objects: &[Listed]) -> Result<()> {
        let total = objects.iter().fold(0u64, |s, o| s.saturating_add(o.size));
        if total > MAX_MODEL_BYTES {
            return Err(Error::too_large(format!(
                "model '{model}' holds {total} bytes, more than {MAX_MODEL_BYTES}"
            )));
        }
        let staging = tempfile::Builder::new()
            .prefix(&format!(".staging-{model}-"))
            .tempdir_in(&self.local)
            .map_err(|e| Error::internal(format!("cannot create a staging directory: {e}")))?;
        for o in objects {
            let key = o
                .rel
                .iter()
                .fold(self.prefix.clone(), |p, s| p.clone().join(s.as_str()));
            let target = o
                .rel
                .iter()
                .fold(staging.path().to_path_buf(), |p, s| p.join(s));
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).map_err(io_err)?;
            }
            self.download_one(&key, o.size, &target).await?;
        }
        let dest = self.local.join(model);
        let old = self.local.join(format!(".old-{model}"));
        let _ = std::fs::remove_dir_all(&old);
        if dest.exists() {
            std::fs::rename(&dest, &old).map_err(io_err)?;
        }
        let staged = staging.keep();
        std::fs::rename(staged.join(model), &dest).map_err(io_err)?;
        let _ = std::fs::remove_dir_all(&staged);
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    }

    /// Streams one object to `target`, chunk by chunk (memory stays one chunk whatever the
    /// object's size), refusing one whose length differs from what was listed.
    async fn download_one(&self, key: &ObjectPath, listed: u64, target: &Path) -> Result<()> {
        use std::io::Write;
        let failed =
            |e: object_store::Error| Error::unavailable(format!("cannot download '{key}': {e}"));
        let mut stream = self.store.get(key).await.map_err(failed)?.into_stream();
        let mut file = std::io::BufWriter::new(std::fs::File::create(target).map_err(io_err)?);
        let mut written = 0u64;
        while let Some(chunk) = stream.try_next().await.map_err(failed)? {
            written = written.saturating_add(chunk.len() as u64);
            if written > listed {
                break;
            }
            file.write_all(&chunk).map_err(io_err)?;
        }
        if written != listed {
            return Err(Error::unavailable(format!(
                "'{key}' changed while it downloaded ({written} bytes or more, listed {listed})"
            )));
        }
        file.into_inner()
            .map_err(|e| io_err(e.into_error()))?
            .sync_all()
            .map_err(io_err)
    }
}

/// A bucket (S3, GCS) or container (Azure), named in errors the way its store names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bucket {
    kind: &'static str,
    name: String,
}

/// What a repository URL opens.
struct Opened {
    store: Arc<dyn ObjectStore>,
    bucket: Bucket,
    prefix: String,
}

impl Opened {
    fn new(store: impl ObjectStore, kind: &'static str, name: String, prefix: String) -> Opened {
        Opened {
            store: Arc::new(store),
            bucket: Bucket { kind, name },
            prefix,
        }
    }
}

/// Reads an environment variable (a parameter so tests need not touch the process's).
type Env<'a> = &'a dyn Fn(&str) -> std::result::Result<String, std::env::VarError>;

/// Opens the store a repository URL names. The forms Triton reads, and where each takes its
/// credentials from:
///
/// - `s3://bucket/prefix`: the `AWS_*` environment (`AWS_ACCESS_KEY_ID`,
///   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, web
///   identity and container credentials), else the profile (`AWS_PROFILE`, else `default`) in
///   `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`,
///   `AWS_CONFIG_FILE`).
/// - `gs://bucket/prefix`: `GOOGLE_APPLICATION_CREDENTIALS` (or gcloud's application-default
///   file, else the instance's service account). With `STORAGE_EMULATOR_HOST` set, as Google's
///   own clients read it, requests go unsigned to that emulator.
/// - `as://account/container/prefix` (Triton's form) and `az://container/prefix` (the account
///   from `AZURE_STORAGE_ACCOUNT_NAME` or Triton's `AZURE_STORAGE_ACCOUNT`): the account key
///   from `AZURE_STORAGE_ACCOUNT_KEY` or Triton's `AZURE_STORAGE_KEY`, else the other
///   `AZURE_*` credentials (SAS token, service principal, workload identity, managed
///   identity). `AZURE_STORAGE_USE_EMULATOR=true` talks to Azurite (`AZURITE_BLOB_STORAGE_URL`).
fn open(url: &str, env: Env) -> Result<Opened> {
    let built = |e: object_store::Error| Error::invalid(format!("model repository '{url}': {e}"));
    let var = |k: &str| env(k).ok().filter(|v| !v.is_empty());
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = split_first(url, rest, "bucket")?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(&bucket);
        let profile = aws_profile(env);
        let from_env = var("AWS_ACCESS_KEY_ID").is_some()
            || var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
            || var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
            || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some();
        if let (false, Some(id), Some(secret)) = (
            from_env,
            profile.get("aws_access_key_id"),
            profile.get("aws_secret_access_key"),
        ) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(token) = profile.get("aws_session_token") {
                b = b.with_token(token);
            }
        }
        let region_in_env = var("AWS_REGION").is_some() || var("AWS_DEFAULT_REGION").is_some();
        if let (false, Some(region)) = (region_in_env, profile.get("region")) {
            b = b.with_region(region);
        }
        let endpoint_in_env = var("AWS_ENDPOINT_URL").is_some() || var("AWS_ENDPOINT").is_some();
        if let (false, Some(endpoint)) = (endpoint_in_env, profile.get("endpoint_url")) {
            b = b.with_endpoint(endpoint);
        }
        return Ok(Opened::new(
            b.build().map_err(built)?,
            "bucket",
            bucket,
            prefix,
        ));
    }
    if let Some(rest) = url.strip_prefix("gs://") {
        let (bucket, prefix) = split_first(url, rest, "bucket")?;
        let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(&bucket);
        if let Some(host) = var("STORAGE_EMULATOR_HOST") {
            let base = match host.contains("://") {
                true => host.trim_end_matches('/').to_string(),
                false => format!("http://{}", host.trim_end_matches('/')),
            };
            b = b
                .with_base_url(&base)
                .with_skip_signature(true)
                .with_client_options(ClientOptions::new().with_allow_http(true));
        }
        return Ok(Opened::new(
            b.build().map_err(built)?,
            "bucket",
            bucket,
            prefix,
        ));
    }
    let (account, rest) = if let Some(rest) = url.strip_prefix("as://") {
        let (account, rest) = split_first(url, rest, "storage account")?;
        (Some(account), rest)
    } else if let Some(rest) = url.strip_prefix("az://") {
        (
            var("AZURE_STORAGE_ACCOUNT_NAME").or_else(|| var("AZURE_STORAGE_ACCOUNT")),
            rest.to_string(),
        )
    } else {
        return Err(Error::unsupported(format!(
            "model repository '{url}': an object-store repository is s3://, gs://, as:// or az://"
        )));
    };
    let (container, prefix) = split_first(url, &rest, "container")?;
    let mut b = MicrosoftAzureBuilder::from_env().with_container_name(&container);
    if let Some(account) = account {
        b = b.with_account(account);
    }
    let key_in_env =
        var("AZURE_STORAGE_ACCOUNT_KEY").is_some() || var("AZURE_STORAGE_ACCESS_KEY").is_some();
    if let (false, Some(key)) = (key_in_env, var("AZURE_STORAGE_KEY")) {
        b = b.with_access_key(key);
    }
    Ok(Opened::new(
        b.build().map_err(built)?,
        "container",
        container,
        prefix,
    ))
}

/// `first/the/rest` as (`first`, `the/rest`), refusing an empty `first`.
fn split_first(url: &str, rest: &str, what: &str) -> Result<(String, String)> {
    let (first, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if first.is_empty() {
        return Err(Error::invalid(format!(
            "model repository '{url}': no {what} named"
        )));
    }
    Ok((first.to_string(), prefix.to_string()))
}

/// The AWS profile's settings (`AWS_PROFILE`, else `default`): the shared credentials file's
/// section, then the config file's (`[profile name]`, or `[default]`) for what that leaves
/// out, as the AWS SDKs read them. Missing or unreadable files give nothing.
fn aws_profile(env: Env) -> BTreeMap<String, String> {
    let name = env("AWS_PROFILE")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let home = env("HOME").ok().filter(|h| !h.is_empty());
    let file = |var: &str, default: &str| {
        env(var)
            .ok()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                home.as_ref()
                    .map(|h| Path::new(h).join(".aws").join(default))
            })
            .and_then(|p| read_small(&p))
    };
    let mut out = file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .map(|text| ini_section(&text, &name))
        .unwrap_or_default();
    let config_section = match name.as_str() {
        "default" => "default".to_string(),
        other => format!("profile {other}"),
    };
    if let Some(text) = file("AWS_CONFIG_FILE", "config") {
        for (k, v) in ini_section(&text, &config_section) {
            out.entry(k).or_insert(v);
        }
    }
    out
}

/// A credentials or config file, if it is readable and no larger than 1 MiB.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The `key = value` pairs of one `[section]` of an INI file (keys lower-cased; comments,
/// blank lines and indented continuation lines skipped).
fn ini_section(text: &str, section: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.split_whitespace().collect::<Vec<_>>().join(" ") == section;
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

fn io_err(e: std::io::Error) -> Error {
    Error::internal(format!("writing the repository mirror: {e}"))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
