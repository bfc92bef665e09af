//! Versions swapped back out for breaching their SLA, remembered across restarts
//! (`--state-dir`): a restarted server, or a poll or load of the same files, keeps them out of
//! service instead of serving them again without a watch. A record holds only while the model's
//! files are exactly those that were rolled back (a digest of their paths and contents): a new
//! upload, a fixed version or a changed config forgets it and loads normally.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The file under the state directory.
const FILE: &str = "rolled-back.json";
/// At most this many bytes of it are read.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// At most this many models are remembered (the oldest are forgotten past it).
const MAX_RECORDS: usize = 1024;

/// Why, and for which files, some versions of one model are withheld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The versions rolled back.
    pub versions: Vec<u64>,
    /// [`digest`] of the model directory when they were.
    pub digest: String,
    /// The rollback's reason, shown in the repository index.
    pub reason: String,
    /// When, in seconds since the Unix epoch (the oldest go first past `MAX_RECORDS`).
    #[serde(default)]
    pub at: u64,
}

/// The remembered rollbacks, by model; kept only in memory without a state directory.
pub struct Withheld {
    path: Option<PathBuf>,
    records: Mutex<BTreeMap<String, Record>>,
}

impl Withheld {
    /// The rollbacks remembered under `state_dir` (none without one). A missing file is an
    /// empty record; an unreadable or malformed one is logged and set aside, never fatal.
    pub fn open(state_dir: Option<&Path>) -> Withheld {
        let path = state_dir.map(|d| d.join(FILE));
        let records = path.as_deref().map(read).unwrap_or_default();
        if !records.is_empty() {
            tracing::warn!(
                models = ?records.keys().collect::<Vec<_>>(),
                "versions rolled back before the restart stay withheld until their files change"
            );
        }
        Withheld {
            path,
            records: Mutex::new(records),
        }
    }

    /// The record for `model`, if its files in `dir` are still the ones rolled back; a record
    /// whose files changed is forgotten.
    pub fn check(&self, model: &str, dir: &Path) -> Option<Record> {
        let record = self.records.lock().expect("withheld").get(model).cloned()?;
        if digest(dir).as_deref() == Some(record.digest.as_str()) {
            return Some(record);
        }
        tracing::info!(
            model,
            "files changed since the rollback; the rolled-back versions may load again"
        );
        self.forget(model);
        None
    }

    /// Remembers that `versions` of `model` (files in `dir`) were rolled back.
    pub fn remember(&self, model: &str, dir: &Path, versions: Vec<u64>, reason: &str) {
        let Some(digest) = digest(dir) else {
            return;
        };
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut records = self.records.lock().expect("withheld");
        records.insert(
            model.to_string(),
            Record {
                versions,
                digest,
                reason: reason.to_string(),
                at,
            },
        );
        while records.len() > MAX_RECORDS {
            let oldest = records
                .iter()
                .min_by_key(|(_, r)| r.at)
                .map(|(n, _)| n.clone());
            match oldest {
                Some(n) => records.remove(&n),
                None => break,
            };
        }
        self.save(&records);
    }

    /// Forgets `model`'s record, if any.
    pub fn forget(&self, model: &str) {
        let mut records = self.records.lock().expect("withheld");
        if records.remove(model).is_some() {
            self.save(&records);
        }
    }

    /// Writes the records whole (a temporary file renamed into place); a failure is logged and
    /// the records stay in memory.
    fn save(&self, records: &BTreeMap<String, Record>) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            let dir = path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            let tmp = dir.join(format!(".{FILE}.partial"));
            std::fs::write(&tmp, serde_json::to_vec_pretty(records)?)?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::error!(path = %path.display(), error = %e, "cannot save the rolled-back versions; they are withheld until the server restarts");
        }
    }
}

fn read(path: &Path) -> BTreeMap<String, Record> {
    let mut text = String::new();
    match std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES).read_to_string(&mut text)) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot read the rolled-back versions; none are withheld");
            return BTreeMap::new();
        }
    }
    serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::error!(path = %path.display(), error = %e, "the rolled-back versions file is malformed; none are withheld");
        BTreeMap::new()
    })
}

/// A SHA-256 over a model directory's relative paths and contents (four levels deep, as the
/// repository goes), or `None` if it cannot be read. Unlike the poll fingerprint it ignores
/// modification times, so a repository mirrored again from object storage digests the same.
pub fn digest(dir: &Path) -> Option<String> {
    use sha2::Digest;
    fn walk(root: &Path, p: &Path, h: &mut sha2::Sha256, depth: usize) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(p)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let kind = e.file_type()?;
            if kind.is_dir() {
                if depth < 4 {
                    h.update(format!("d {}\n", rel.display()));
                    walk(root, &path, h, depth + 1)?;
                }
            } else if kind.is_file() || path.is_file() {
                h.update(format!(
                    "f {} {}\n",
                    rel.display(),
                    std::fs::metadata(&path)?.len()
                ));
                let (file, _) = wisp_core::repository::open_regular(
                    &path,
                    wisp_core::repository::MAX_MODEL_FILE_BYTES,
                )?;
                std::io::copy(
                    &mut file.take(wisp_core::repository::MAX_MODEL_FILE_BYTES),
                    h,
                )?;
            }
        }
        Ok(())
    }
    let mut h = sha2::Sha256::new();
    walk(dir, dir, &mut h, 0).ok()?;
    Some(crate::signing::hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_hold_only_for_the_same_files() {
        let state = tempfile::tempdir().unwrap();
        let model = tempfile::tempdir().unwrap();
        std::fs::create_dir(model.path().join("2")).unwrap();
        std::fs::write(model.path().join("2/model.onnx"), "bad").unwrap();
        let w = Withheld::open(Some(state.path()));
        w.remember("m", model.path(), vec![2], "rolled back: slow");
        let again = Withheld::open(Some(state.path()));
        let r = again.check("m", model.path()).expect("remembered");
        assert_eq!(
            (r.versions, r.reason.as_str()),
            (vec![2], "rolled back: slow")
        );
        // Touching the files keeps the record; changing them forgets it, on disk too.
        std::fs::write(model.path().join("2/model.onnx"), "bad").unwrap();
        assert!(again.check("m", model.path()).is_some());
        std::fs::write(model.path().join("2/model.onnx"), "good").unwrap();
        assert!(again.check("m", model.path()).is_none());
        assert!(Withheld::open(Some(state.path()))
            .check("m", model.path())
            .is_none());
    }

    #[test]
    fn a_malformed_file_withholds_nothing_and_is_replaced() {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join(FILE), "{not json").unwrap();
        let w = Withheld::open(Some(state.path()));
        let model = tempfile::tempdir().unwrap();
        assert!(w.check("m", model.path()).is_none());
        w.remember("m", model.path(), vec![3], "why");
        assert!(Withheld::open(Some(state.path()))
            .check("m", model.path())
            .is_some());
    }

    #[test]
    fn without_a_state_dir_records_live_in_memory() {
        let model = tempfile::tempdir().unwrap();
        let w = Withheld::open(None);
        w.remember("m", model.path(), vec![2], "why");
        assert!(w.check("m", model.path()).is_some());
    }

    #[test]
    fn digests_see_contents_and_names_not_times() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        for d in [a.path(), b.path()] {
            std::fs::create_dir(d.join("1")).unwrap();
            std::fs::write(d.join("1/model.onnx"), "x").unwrap();
        }
        assert_eq!(digest(a.path()), digest(b.path()));
        std::fs::rename(b.path().join("1"), b.path().join("2")).unwrap();
        assert_ne!(digest(a.path()), digest(b.path()));
        assert!(digest(&a.path().join("absent")).is_none());
    }
}
