//! The model directories under a repository's prefix, even when a key's first segment is `..`.
//!
//! The store's client parses every key and common prefix it lists into a path, and refuses a
//! whole listing page over one it cannot parse. A key such as `prefix/../x` makes even the
//! one-level (delimiter) listing of the model directories fail, so that no model at all could
//! sync. Such keys sort before every model name (`.` is below every letter, digit, `_` and most
//! punctuation), so the models are then listed from just past them, and the key is reported.

use std::collections::BTreeSet;

use futures_util::TryStreamExt;
use object_store::ObjectStore;
use wisp_core::{Error, Result};

use super::{RemoteRepo, MAX_OBJECTS};

impl RemoteRepo {
    /// The names of the directories right under the prefix that may be models.
    pub(super) async fn model_dirs(&self) -> Result<Vec<String>> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let found: Vec<String> = match self.store.list_with_delimiter(prefix).await {
            Ok(top) => top
                .common_prefixes
                .iter()
                .take(MAX_OBJECTS)
                .filter_map(|d| d.filename().map(str::to_string))
                .collect(),
            Err(e @ object_store::Error::InvalidPath { .. }) => {
                tracing::error!(
                    repository = %self.url, error = %self.list_failed(e),
                    "an object key's first segment cannot be a path (such as '..'): it is skipped, and the models are listed past it"
                );
                self.dirs_past_dots().await?
            }
            Err(e) => return Err(self.list_failed(e)),
        };
        Ok(found
            .into_iter()
            .filter(|m| wisp_core::repository::is_model_name(m))
            .collect())
    }

    /// The first segments of every key that sorts after `<prefix>/..0`, past any key whose
    /// first segment is `.` or `..`.
    async fn dirs_past_dots(&self) -> Result<Vec<String>> {
        let offset = self.prefix.clone().join("..0");
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let mut stream = self.store.list_with_offset(prefix, &offset);
        let mut dirs = BTreeSet::new();
        let mut count = 0usize;
        while let Some(meta) = stream.try_next().await.map_err(|e| self.list_failed(e))? {
            count += 1;
            if count > MAX_OBJECTS {
                return Err(Error::invalid(format!(
                    "model repository '{}' holds more than {MAX_OBJECTS} objects",
                    self.url
                )));
            }
            let first = meta
                .location
                .prefix_match(&self.prefix)
                .and_then(|mut rel| rel.next())
                .map(|p| p.as_ref().to_string());
            if let Some(first) = first {
                dirs.insert(first);
            }
        }
        Ok(dirs.into_iter().collect())
    }
}
