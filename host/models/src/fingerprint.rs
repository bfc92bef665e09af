//! Repository fingerprints: what poll mode compares to notice a changed model, and what tells
//! an in-place resize (only `config.pbtxt` changed) from a reload.

use std::path::Path;

/// A hash of everything in a model directory that a reload depends on: the files' paths, sizes
/// and modification times (config, labels, every version directory).
pub fn fingerprint(dir: &Path) -> u64 {
    fingerprint_except(dir, None)
}

/// [`fingerprint`] without `config.pbtxt`.
pub(super) fn fingerprint_files(dir: &Path) -> u64 {
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
