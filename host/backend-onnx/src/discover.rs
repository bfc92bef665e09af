//! Finding the ONNX Runtime shared library: flag, then `ORT_DYLIB_PATH`, then an installed
//! `onnxruntime` Python package (`onnxruntime/capi/libonnxruntime.so*`).

use std::path::{Path, PathBuf};
use std::process::Command;

pub use wisp_core::env::{EnvSource, ProcessEnv};

/// The ONNX Runtime library to load, or `None` (then tract serves ONNX models).
///
/// `python` is the interpreter asked for an installed `onnxruntime` package (`python3` by
/// default; `WISP_PYTHON` overrides it), tried only when neither the flag nor
/// `ORT_DYLIB_PATH` names a library.
pub fn find_onnxruntime(flag: Option<&Path>, env: &dyn EnvSource) -> Option<PathBuf> {
    if let Some(p) = flag {
        return Some(p.to_path_buf());
    }
    if let Some(p) = env.var("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let python = env.var("WISP_PYTHON").unwrap_or_else(|| "python3".into());
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.util,os;s=importlib.util.find_spec('onnxruntime');print(os.path.dirname(s.origin) if s else '')",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let capi = Path::new(dir.trim()).join("capi");
    library_in(&capi)
}

/// The `libonnxruntime.so*` in `dir`, preferring the fully versioned name.
fn library_in(dir: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        })
        .collect();
    libs.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    libs.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn flag_wins_then_env() {
        let mut env = HashMap::new();
        env.insert("ORT_DYLIB_PATH".to_string(), "/env/lib.so".to_string());
        assert_eq!(
            find_onnxruntime(Some(Path::new("/flag.so")), &env),
            Some(PathBuf::from("/flag.so"))
        );
        assert_eq!(
            find_onnxruntime(None, &env),
            Some(PathBuf::from("/env/lib.so"))
        );
    }

    #[test]
    fn missing_python_means_no_library() {
        let mut env = HashMap::new();
        env.insert("WISP_PYTHON".to_string(), "/nonexistent/python".to_string());
        assert_eq!(find_onnxruntime(None, &env), None);
    }

    #[test]
    fn finds_versioned_library_in_a_dir() {
        let d = std::env::temp_dir().join(format!("wisp-ort-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("libonnxruntime.so.1.20.0"), b"").unwrap();
        std::fs::write(d.join("other.so"), b"").unwrap();
        assert_eq!(library_in(&d), Some(d.join("libonnxruntime.so.1.20.0")));
        std::fs::remove_dir_all(d).unwrap();
    }
}
