//! Model repositories laid out as Triton's: `<repo>/<model>/config.pbtxt`, labels files beside
//! it, and integer version directories `<repo>/<model>/<version>/<model file>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::VersionPolicy;
use crate::error::{Error, Result};

/// A model directory found in a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDir {
    /// Model name (the directory name).
    pub name: String,
    /// Path of the model directory.
    pub path: PathBuf,
}

/// The result of scanning one or more repositories.
#[derive(Debug, Default)]
pub struct Scan {
    /// Models found exactly once across all roots.
    pub models: Vec<ModelDir>,
    /// Names that cannot be served, with the reason (e.g. in two repositories).
    pub broken: Vec<(String, Error)>,
}

/// Lists model directories under each root. A name found in more than one root is unavailable,
/// as in Triton without `--model-namespacing`. A missing root is an error for the whole scan.
pub fn scan(roots: &[PathBuf]) -> Result<Scan> {
    let mut found: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for root in roots {
        let entries = std::fs::read_dir(root).map_err(|e| {
            Error::invalid(format!(
                "model repository '{}' cannot be read: {e}",
                root.display()
            ))
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with('.') || !path.is_dir() {
                continue;
            }
            found.entry(name.to_string()).or_default().push(path);
        }
    }
    let mut scan = Scan::default();
    for (name, mut paths) in found {
        if paths.len() == 1 {
            scan.models.push(ModelDir {
                name,
                path: paths.remove(0),
            });
        } else {
            let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            tracing::error!(model = %name, paths = %list.join(", "), "model in more than one repository");
            // Clients see this reason: it names no host path.
            scan.broken.push((
                name.clone(),
                Error::invalid(format!(
                    "model '{name}' appears in {} model repositories",
                    list.len()
                )),
            ));
        }
    }
    Ok(scan)
}

/// Whether `name` (from the network: a load request's model name) can name a model directory:
/// one path component of at most 255 bytes, with no NUL, and not hidden ([`scan`] skips names
/// starting with `.`, which also rules out `.` and `..`).
pub fn is_model_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
}

/// Resolves `relative`, a path a config names, inside `model_dir`, or says why it may not be
/// used. Configs come from the network too (a load request's `config`), so a path is refused
/// when it is absolute, has a `..` or root component, or, once symlinks are followed, leaves the
/// model directory. A path that does not exist yet is only checked lexically; the caller reports
/// it missing.
pub fn confine(model_dir: &Path, relative: &str) -> std::result::Result<PathBuf, String> {
    use std::path::Component;
    let rel = Path::new(relative);
    if relative.is_empty() {
        return Err("must not be empty".into());
    }
    if relative.contains('\0') {
        return Err("must not contain a NUL byte".into());
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!(
                    "'{relative}' must stay inside the model directory ('..' is not allowed)"
                ))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "'{relative}' must be relative to the model directory (absolute paths are not allowed)"
                ))
            }
        }
    }
    let joined = model_dir.join(rel);
    match (joined.canonicalize(), model_dir.canonicalize()) {
        (Ok(real), Ok(root)) if !real.starts_with(&root) => Err(format!(
            "'{relative}' resolves outside the model directory (through a symbolic link)"
        )),
        _ => Ok(joined),
    }
}

/// The most bytes a model's config or a small file beside it may have (1 MiB).
pub const MAX_SMALL_FILE_BYTES: u64 = 1 << 20;

/// The most bytes a model file (ONNX, wasm) may have (4 GiB).
pub const MAX_MODEL_FILE_BYTES: u64 = 4 << 30;

/// Opens `path` for reading only if it is (or links to) a regular file of at most `max` bytes.
/// A FIFO, a device (`/dev/zero`), a socket or a directory is refused with an error naming
/// it, and opening never blocks (a FIFO without a writer would block an ordinary open for ever).
pub fn open_regular(path: &Path, max: u64) -> std::io::Result<(std::fs::File, u64)> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NONBLOCK);
    let file = opts.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file ({}); only regular files are read from a model directory",
                path.display(),
                file_kind(&meta)
            ),
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} has {} bytes, more than the {max} allowed",
                path.display(),
                meta.len()
            ),
        ));
    }
    Ok((file, meta.len()))
}

/// What kind of file `meta` describes, for errors.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// The bytes of `path`, read only if it is a regular file of at most `max` bytes
/// ([`open_regular`]); reading stops at `max` even if the file grows meanwhile.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path, max)?;
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_regular(path, max)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// Integer-named version directories of a model, ascending.
pub fn versions(model_dir: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(model_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .collect();
    out.sort_unstable();
    out
}

/// The versions a policy serves out of those available, ascending.
pub fn select_versions(policy: &VersionPolicy, available: &[u64]) -> Result<Vec<u64>> {
    if let Some(s) = &policy.specific {
        let mut out = Vec::new();
        for &v in &s.versions {
            let v = v as u64;
            if !available.contains(&v) {
                return Err(Error::invalid(format!(
                    "version_policy.specific lists version {v} but there is no directory '{v}'"
                )));
            }
            out.push(v);
        }
        out.sort_unstable();
        out.dedup();
        return Ok(out);
    }
    if policy.all.is_some() {
        return Ok(available.to_vec());
    }
    let n = policy.latest.as_ref().map_or(1, |l| l.num_versions.max(1)) as usize;
    Ok(available[available.len().saturating_sub(n)..].to_vec())
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_bounded_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.onnx");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        let e = read_regular(&file, 4).unwrap_err();
        assert!(e.to_string().contains("more than the 4 allowed"), "{e}");
        // A symbolic link to a regular file is read; one to a device is not (it never ends).
        let link = dir.path().join("link.onnx");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular(&link, 5).unwrap(), b"12345");
        let zero = dir.path().join("zero.onnx");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_regular(&zero, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("a device"), "{e}");
        // A FIFO with no writer: refused at once, where an open would block for ever.
        let fifo = dir.path().join("fifo.onnx");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let start = std::time::Instant::now();
        let e = read_regular(&fifo, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        let e = read_regular(dir.path(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    use super::*;
    use crate::config::{Latest, Specific};

    #[test]
    fn model_names_are_one_visible_path_component() {
        for ok in ["add_sub", "a.b", "x-1", &"m".repeat(255)] {
            assert!(is_model_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a\\b",
            "nul\0",
            &"m".repeat(256),
        ] {
            assert!(!is_model_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn policies_select_versions() {
        let avail = [1, 2, 5];
        let latest = |n| VersionPolicy {
            latest: Some(Latest { num_versions: n }),
            ..Default::default()
        };
        assert_eq!(select_versions(&latest(1), &avail).unwrap(), vec![5]);
        assert_eq!(select_versions(&latest(2), &avail).unwrap(), vec![2, 5]);
        assert_eq!(select_versions(&latest(9), &avail).unwrap(), vec![1, 2, 5]);
        let all = VersionPolicy {
            all: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(select_versions(&all, &avail).unwrap(), vec![1, 2, 5]);
        let spec = |v: Vec<i64>| VersionPolicy {
            specific: Some(Specific { versions: v }),
            ..Default::default()
        };
        assert_eq!(
            select_versions(&spec(vec![5, 1]), &avail).unwrap(),
            vec![1, 5]
        );
        assert!(select_versions(&spec(vec![3]), &avail).is_err());
        assert!(select_versions(&latest(1), &[]).unwrap().is_empty());
    }

    #[test]
    fn confine_keeps_paths_inside_the_model_directory() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::write(model.join("labels.txt"), "a").unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        assert_eq!(
            confine(&model, "labels.txt").unwrap(),
            model.join("labels.txt")
        );
        assert_eq!(confine(&model, "sub").unwrap(), model.join("sub"));
        assert_eq!(
            confine(&model, "./missing").unwrap(),
            model.join("./missing")
        );
        for bad in ["/etc/passwd", "../secret", "sub/../../secret", "", "a\0b"] {
            assert!(confine(&model, bad).is_err(), "{bad:?} was allowed");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret"), model.join("link")).unwrap();
            std::os::unix::fs::symlink(dir.path(), model.join("up")).unwrap();
            let e = confine(&model, "link").unwrap_err();
            assert!(e.contains("symbolic link"), "{e}");
            assert!(confine(&model, "up/secret").is_err());
            assert!(confine(&model, "up").is_err());
        }
    }

    #[test]
    fn scan_finds_models_and_duplicates() {
        let a = std::env::temp_dir().join(format!("wisp-scan-a-{}", std::process::id()));
        let b = std::env::temp_dir().join(format!("wisp-scan-b-{}", std::process::id()));
        for d in [
            a.join("m1/1"),
            a.join("dup/1"),
            b.join("dup/1"),
            b.join("m2/3"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::create_dir_all(a.join("m1/notaversion")).unwrap();
        let s = scan(&[a.clone(), b.clone()]).unwrap();
        let names: Vec<_> = s.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, vec!["m1", "m2"]);
        assert_eq!(s.broken[0].0, "dup");
        assert_eq!(versions(&a.join("m1")), vec![1]);
        assert!(scan(&[a.join("missing")]).is_err());
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }
}
