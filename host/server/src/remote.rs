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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use wisp_core::{Error, Result};

/// At most this many objects under one repository prefix.
pub const MAX_OBJECTS: usize = 100_000;
/// At most this many bytes in one model's objects.
pub const MAX_MODEL_BYTES: u64 = 16 << 30;

/// One object as listed: its path under the prefix, and what tells a change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    rel: Vec<String>,
    tag: String,
    size: u64,
}

/// A repository on object storage and its local mirror.
pub struct RemoteRepo {
    url: String,
    bucket: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    local: PathBuf,
    /// Per model, the listing its mirrored copy was downloaded from.
    synced: Mutex<BTreeMap<String, Vec<Listed>>>,
}

impl RemoteRepo {
    /// The repository at `url`, mirrored under `cache_root`. Credentials, region and endpoint
    /// come from the usual `AWS_*` environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, web identity and container
    /// credentials).
    pub fn new(url: &str, cache_root: &Path) -> Result<RemoteRepo> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            Error::unsupported(format!(
                "model repository '{url}': only s3:// object stores are supported in this build (gs:// and az:// are not yet)"
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::invalid(format!(
                "model repository '{url}': no bucket named"
            )));
        }
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| Error::invalid(format!("model repository '{url}': {e}")))?;
        let digest = {
            use sha2::Digest;
            crate::signing::hex(&sha2::Sha256::digest(url.as_bytes()))
        };
        let local = cache_root.join(format!("{}-{}", sanitize(bucket), &digest[..16]));
        std::fs::create_dir_all(&local).map_err(|e| {
            Error::internal(format!(
                "model repository '{url}': cannot create its mirror {}: {e}",
                local.display()
            ))
        })?;
        Ok(RemoteRepo {
            url: url.to_string(),
            bucket: bucket.to_string(),
            store: Arc::new(store),
            prefix: ObjectPath::from(prefix.trim_matches('/')),
            local,
            synced: Mutex::new(BTreeMap::new()),
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
        let listing = self.list().await?;
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
        for model in previous.keys().filter(|m| !listing.contains_key(*m)) {
            let _ = std::fs::remove_dir_all(self.local.join(model));
            self.synced.lock().expect("synced").remove(model);
            changed.push(model.clone());
        }
        // A first sync also clears models mirrored by an earlier run but gone since.
        if previous.is_empty() {
            for entry in std::fs::read_dir(&self.local)
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !listing.contains_key(&name) && !name.starts_with('.') {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        if !changed.is_empty() {
            tracing::info!(repository = %self.url, models = ?changed, "object-store repository synced");
        }
        Ok(changed)
    }

    /// Every object under the prefix, by model.
    async fn list(&self) -> Result<BTreeMap<String, Vec<Listed>>> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let mut stream = self.store.list(prefix);
        let mut out: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        let mut count = 0usize;
        while let Some(meta) = stream.try_next().await.map_err(|e| {
            Error::unavailable(format!(
                "cannot list model repository '{}' (bucket '{}'): {e}",
                self.url, self.bucket
            ))
        })? {
            count += 1;
            if count > MAX_OBJECTS {
                return Err(Error::invalid(format!(
                    "model repository '{}' holds more than {MAX_OBJECTS} objects",
                    self.url
                )));
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
            let bytes = self
                .store
                .get(&key)
                .await
                .map_err(|e| Error::unavailable(format!("cannot download '{key}': {e}")))?
                .bytes()
                .await
                .map_err(|e| Error::unavailable(format!("cannot download '{key}': {e}")))?;
            if bytes.len() as u64 != o.size {
                return Err(Error::unavailable(format!(
                    "'{key}' changed while it downloaded ({} bytes, listed {})",
                    bytes.len(),
                    o.size
                )));
            }
            let target = o
                .rel
                .iter()
                .fold(staging.path().to_path_buf(), |p, s| p.join(s));
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).map_err(io_err)?;
            }
            std::fs::write(&target, &bytes).map_err(io_err)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_schemes_and_empty_buckets_are_refused_with_the_url() {
        let dir = tempfile::tempdir().unwrap();
        let e = RemoteRepo::new("gs://b/m", dir.path()).err().unwrap();
        assert!(e.message().contains("'gs://b/m'"), "{e}");
        let e = RemoteRepo::new("s3:///m", dir.path()).err().unwrap();
        assert!(e.message().contains("no bucket"), "{e}");
    }
}
