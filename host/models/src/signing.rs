//! Model integrity: a per-version manifest of every file's sha256, signed with ed25519.
//!
//! `<model>/<version>/MANIFEST` lists, one per line and sorted by path, `<sha256 hex>  <path>`
//! for every file the version is made of: the files of its version directory and the model's
//! own files outside any version directory (`config.pbtxt`, labels, warm-up data, plugin data),
//! paths relative to the model directory. `<model>/<version>/MANIFEST.sig` holds the hex
//! ed25519 signature of the manifest's bytes. The format is plain text so `sha256sum` can
//! check it by hand.
//!
//! With `--model-verify-key FILE` a version that has a manifest loads only if the signature
//! verifies and every file matches — no file changed, missing or added. With
//! `--require-signed-models` a version without one does not load either. A failed check leaves
//! the version UNAVAILABLE with the reason (a reload keeps the old version serving), and counts
//! in `wisp_model_verify_failure_total`. `wisp sign` writes the manifest; `wisp keygen` makes a
//! key pair.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};

/// The manifest's file name inside a version directory.
pub const MANIFEST: &str = "MANIFEST";
/// The signature's file name inside a version directory.
pub const SIGNATURE: &str = "MANIFEST.sig";

/// How models are checked before they load.
#[derive(Debug, Clone)]
pub struct Verification {
    /// The public key manifests must be signed with.
    pub key: VerifyingKey,
    /// Every version must carry a valid manifest.
    pub required: bool,
    /// Where failed checks are counted (for the metrics).
    pub failures: std::sync::Arc<VerifyFailures>,
}

impl Verification {
    /// [`verify`], counting a failure against `model` and logging it.
    pub fn check(&self, model_dir: &Path, model: &str, version: u64) -> Result<(), String> {
        verify(model_dir, version, self).inspect_err(|why| {
            self.failures.record(model, version);
            tracing::error!(model, version, reason = %why, "integrity check failed");
        })
    }
}

/// Failed checks per (model, version), for the metrics.
#[derive(Debug, Default)]
pub struct VerifyFailures(Mutex<BTreeMap<(String, u64), u64>>);

impl VerifyFailures {
    /// Counts one failed check.
    pub fn record(&self, model: &str, version: u64) {
        *self
            .0
            .lock()
            .expect("verify failures lock")
            .entry((model.to_string(), version))
            .or_default() += 1;
    }

    /// Every (model, version, count).
    pub fn snapshot(&self) -> Vec<(String, u64, u64)> {
        self.0
            .lock()
            .expect("verify failures lock")
            .iter()
            .map(|((m, v), n)| (m.clone(), *v, *n))
            .collect()
    }
}

/// Lower-case hex of `bytes` (how manifests write digests).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str, what: &str) -> Result<[u8; N], String> {
    let t = text.trim();
    if t.len() != 2 * N || !t.is_ascii() {
        return Err(format!("{what} must be {} hex digits", 2 * N));
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&t[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{what} must be {} hex digits", 2 * N))?;
    }
    Ok(out)
}

/// Reads a public key file (64 hex digits).
pub fn read_public_key(path: &Path) -> Result<VerifyingKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let bytes = unhex::<32>(&text, "a public key")?;
    VerifyingKey::from_bytes(&bytes)
        .map_err(|e| format!("{}: not an ed25519 key: {e}", path.display()))
}

/// Reads a secret key file (64 hex digits: the 32-byte seed).
pub fn read_secret_key(path: &Path) -> Result<SigningKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(SigningKey::from_bytes(&unhex::<32>(&text, "a secret key")?))
}

/// A new key pair from the operating system's randomness: (secret hex, public hex).
pub fn generate_key() -> std::io::Result<(String, String)> {
    use std::io::Read;
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    let key = SigningKey::from_bytes(&seed);
    Ok((hex(&seed), hex(key.verifying_key().as_bytes())))
}

/// The files version `version` of the model in `model_dir` is made of, relative to
/// `model_dir`, sorted: everything but other versions' directories and the manifest itself.
fn covered_files(model_dir: &Path, version: u64) -> std::io::Result<Vec<PathBuf>> {
    /// Directories deeper than this are refused rather than walked.
    const MAX_DEPTH: usize = 32;
    fn walk(
        root: &Path,
        rel: &Path,
        version: u64,
        ancestors: &mut Vec<PathBuf>,
        out: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        let dir = root.join(rel);
        // A symbolic link back up the tree (a loop) is refused instead of walked until the
        // stack runs out.
        let real = dir.canonicalize()?;
        if ancestors.contains(&real) {
            return Err(std::io::Error::other(format!(
                "'{}' loops back to a directory that contains it",
                rel.display()
            )));
        }
        if rel.components().count() > MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "'{}' is nested more than {MAX_DEPTH} directories deep",
                rel.display()
            )));
        }
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let path = rel.join(&name);
            let top = rel.as_os_str().is_empty();
            if top {
                if let Some(v) = name.to_str().and_then(|n| n.parse::<u64>().ok()) {
                    if v != version {
                        continue;
                    }
                }
            }
            let meta = std::fs::metadata(entry.path())?;
            if meta.is_dir() {
                ancestors.push(real.clone());
                let walked = walk(root, &path, version, ancestors, out);
                ancestors.pop();
                walked?;
            } else {
                let is_manifest = rel == Path::new(&version.to_string())
                    && (name == MANIFEST || name == SIGNATURE);
                if !is_manifest {
                    out.push(path);
                }
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(model_dir, Path::new(""), version, &mut Vec::new(), &mut out)?;
    out.sort();
    Ok(out)
}

/// The manifest text of a version as its files are now.
pub fn manifest_text(model_dir: &Path, version: u64) -> std::io::Result<String> {
    let mut text = String::new();
    for rel in covered_files(model_dir, version)? {
        let mut hasher = Sha256::new();
        let (mut file, _) = wisp_core::repository::open_regular(
            &model_dir.join(&rel),
            wisp_core::repository::MAX_MODEL_FILE_BYTES,
        )?;
        std::io::copy(&mut file, &mut hasher)?;
        let name = rel.to_string_lossy().replace('\\', "/");
        text.push_str(&format!("{}  {name}\n", hex(&hasher.finalize())));
    }
    Ok(text)
}

/// Writes `MANIFEST` and `MANIFEST.sig` for a version.
pub fn sign(model_dir: &Path, version: u64, key: &SigningKey) -> std::io::Result<()> {
    let text = manifest_text(model_dir, version)?;
    let dir = model_dir.join(version.to_string());
    std::fs::write(dir.join(MANIFEST), &text)?;
    let sig = key.sign(text.as_bytes());
    std::fs::write(dir.join(SIGNATURE), format!("{}\n", hex(&sig.to_bytes())))
}

/// The bytes of `version`'s manifest, its signature checked; `None` when it has none (an
/// error when `v` requires one).
fn signed_manifest(
    model_dir: &Path,
    version: u64,
    v: &Verification,
) -> Result<Option<Vec<u8>>, String> {
    let dir = model_dir.join(version.to_string());
    let small = wisp_core::repository::MAX_SMALL_FILE_BYTES;
    let manifest = match wisp_core::repository::read_regular(&dir.join(MANIFEST), small) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return if v.required {
                Err(format!(
                    "version {version} has no {MANIFEST} and --require-signed-models is set"
                ))
            } else {
                Ok(None)
            };
        }
        Err(e) => return Err(format!("cannot read {version}/{MANIFEST}: {}", e.kind())),
    };
    let sig_text = wisp_core::repository::read_regular_text(&dir.join(SIGNATURE), small)
        .map_err(|e| format!("cannot read {version}/{SIGNATURE}: {}", e.kind()))?;
    let sig = Signature::from_bytes(&unhex::<64>(&sig_text, SIGNATURE)?);
    v.key.verify(&manifest, &sig).map_err(|_| {
        format!("the signature of {version}/{MANIFEST} does not verify with --model-verify-key")
    })?;
    Ok(Some(manifest))
}

/// The SHA-256 the signed manifest of `version` lists for `rel` (a path relative to the model
/// directory), its signature checked again on the bytes read here; `None` when the version has
/// no manifest (and none is required).
pub fn signed_sha256(
    model_dir: &Path,
    version: u64,
    rel: &Path,
    v: &Verification,
) -> Result<Option<[u8; 32]>, String> {
    let Some(manifest) = signed_manifest(model_dir, version, v)? else {
        return Ok(None);
    };
    let name = rel.to_string_lossy().replace('\\', "/");
    let text = String::from_utf8_lossy(&manifest);
    let hash = text
        .lines()
        .filter_map(|l| l.split_once("  "))
        .find(|(_, p)| *p == name)
        .map(|(h, _)| h)
        .ok_or_else(|| format!("file '{name}' is not in the signed manifest"))?;
    unhex::<32>(hash, &name).map(Some)
}

/// Checks a version against `v`: `Ok` when it verifies, or when it has no manifest and none is
/// required; otherwise why not.
pub fn verify(model_dir: &Path, version: u64, v: &Verification) -> Result<(), String> {
    let Some(manifest) = signed_manifest(model_dir, version, v)? else {
        return Ok(());
    };
    let now = manifest_text(model_dir, version)
        .map_err(|e| format!("cannot hash the model's files: {}", e.kind()))?;
    let signed = String::from_utf8_lossy(&manifest);
    if now == signed {
        return Ok(());
    }
    let parse = |t: &str| -> BTreeMap<String, String> {
        t.lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(h, p)| (p.to_string(), h.to_string()))
            .collect()
    };
    let (want, got) = (parse(&signed), parse(&now));
    for (path, hash) in &want {
        match got.get(path) {
            None => return Err(format!("file '{path}' of the signed manifest is missing")),
            Some(h) if h != hash => {
                return Err(format!("file '{path}' does not match the signed manifest"))
            }
            Some(_) => {}
        }
    }
    match got.keys().find(|p| !want.contains_key(*p)) {
        Some(extra) => Err(format!("file '{extra}' is not in the signed manifest")),
        None => Err("the manifest does not match the model's files".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m");
        std::fs::create_dir_all(m.join("1")).unwrap();
        std::fs::create_dir_all(m.join("2")).unwrap();
        std::fs::write(m.join("config.pbtxt"), "max_batch_size: 1").unwrap();
        std::fs::write(m.join("1/model.onnx"), b"weights").unwrap();
        std::fs::write(m.join("2/model.onnx"), b"other weights").unwrap();
        (dir, m)
    }

    fn keys() -> (SigningKey, Verification) {
        let (secret, public) = generate_key().unwrap();
        let sk = SigningKey::from_bytes(&unhex::<32>(&secret, "s").unwrap());
        let pk = VerifyingKey::from_bytes(&unhex::<32>(&public, "p").unwrap()).unwrap();
        assert_eq!(sk.verifying_key(), pk);
        (
            sk,
            Verification {
                key: pk,
                required: false,
                failures: Default::default(),
            },
        )
    }

    #[test]
    fn signed_versions_verify_and_tampering_is_named() {
        let (_d, m) = model();
        let (sk, v) = keys();
        sign(&m, 1, &sk).unwrap();
        let text = std::fs::read_to_string(m.join("1/MANIFEST")).unwrap();
        assert!(
            text.contains("  1/model.onnx\n") && text.contains("  config.pbtxt\n"),
            "{text}"
        );
        assert!(
            !text.contains("2/model.onnx"),
            "other versions are not covered"
        );
        verify(&m, 1, &v).unwrap();
        // another version's files may change freely
        std::fs::write(m.join("2/model.onnx"), b"changed").unwrap();
        verify(&m, 1, &v).unwrap();
        std::fs::write(m.join("config.pbtxt"), "max_batch_size: 2").unwrap();
        assert!(verify(&m, 1, &v)
            .unwrap_err()
            .contains("'config.pbtxt' does not match"));
        std::fs::write(m.join("config.pbtxt"), "max_batch_size: 1").unwrap();
        std::fs::write(m.join("1/extra.bin"), b"x").unwrap();
        assert!(verify(&m, 1, &v)
            .unwrap_err()
            .contains("'1/extra.bin' is not in the signed"));
        std::fs::remove_file(m.join("1/extra.bin")).unwrap();
        std::fs::remove_file(m.join("1/model.onnx")).unwrap();
        assert!(verify(&m, 1, &v).unwrap_err().contains("missing"));
    }

    #[test]
    fn a_wrong_key_or_edited_manifest_fails_and_unsigned_needs_permission() {
        let (_d, m) = model();
        let (sk, v) = keys();
        let (_, other) = keys();
        sign(&m, 1, &sk).unwrap();
        assert!(verify(&m, 1, &other)
            .unwrap_err()
            .contains("does not verify"));
        let path = m.join("1/MANIFEST");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("config.pbtxt", "config.pbtx")).unwrap();
        assert!(verify(&m, 1, &v).unwrap_err().contains("does not verify"));
        // version 2 has no manifest: fine unless required
        verify(&m, 2, &v).unwrap();
        let required = Verification {
            required: true,
            ..v
        };
        assert!(verify(&m, 2, &required)
            .unwrap_err()
            .contains("--require-signed-models"));
        assert!(unhex::<32>("zz", "k").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_loop_is_an_error_not_a_stack_overflow() {
        let (_d, m) = model();
        let (sk, v) = keys();
        std::fs::create_dir_all(m.join("1/assets")).unwrap();
        std::fs::write(m.join("1/assets/a.txt"), b"a").unwrap();
        std::os::unix::fs::symlink("..", m.join("1/assets/up")).unwrap();
        let e = sign(&m, 1, &sk).unwrap_err().to_string();
        assert!(e.contains("loops back"), "{e}");
        // A link to a sibling directory is followed once and covered.
        std::fs::remove_file(m.join("1/assets/up")).unwrap();
        std::fs::create_dir_all(m.join("shared")).unwrap();
        std::fs::write(m.join("shared/vocab.txt"), b"a b").unwrap();
        std::os::unix::fs::symlink("../../shared", m.join("1/assets/vocab")).unwrap();
        sign(&m, 1, &sk).unwrap();
        let text = std::fs::read_to_string(m.join("1/MANIFEST")).unwrap();
        assert!(text.contains("1/assets/vocab/vocab.txt"), "{text}");
        assert!(text.contains("  shared/vocab.txt"), "{text}");
        verify(&m, 1, &v).unwrap();
    }
}
