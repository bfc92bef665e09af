//! The plugin toolchain carried inside the `wisp` binary: the WIT package and the Rust, Python
//! and JavaScript SDKs (embedded at build time by `build.rs`), written out into a plugin
//! project, and the language tools a build needs, located or installed.
//!
//! A project made by `wisp plugin new` holds its own `wit/` and `wisp-sdk/` copies, so it
//! builds without a Wisp source tree; a project without them gets them from the binary at
//! build time.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{bail, Context};

include!(concat!(env!("OUT_DIR"), "/plugin_kit.rs"));

/// The componentize-py release the Python SDK is built and tested with.
pub(crate) const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// The pip requirement `wisp plugin` installs componentize-py from: the release pinned by the
/// SHA-256 of each of its wheels on PyPI (it has no dependencies), so that pip installs those
/// exact files or nothing (`--require-hashes`).
const COMPONENTIZE_PY_PINNED: &str = "componentize-py==0.25.1 \\
    --hash=sha256:8623cd8cab8453cb0cd8bf03f3c7103420d06f2f3d360186a280a70a1ca5e89f \\
    --hash=sha256:7b6a87c520358166843af0daa86d2312d7af4cbcbbf1e598951085cf7f2991ca \\
    --hash=sha256:a556991534cc496207a9d2ca733c4b0f17ed38ef56a8d6b5f1847fdf1225dd1b \\
    --hash=sha256:65fbc4a94df1de8acf7da50a1f5ed1711230188844e53e6332d99029be4e0afa \\
    --hash=sha256:c7fd552fb0849858b0c1e8981543ed5dff4b0cc1597a8ea0bc26a495786dc0c6
";

/// Writes `files` (relative paths) under `dir`.
pub(crate) fn write_tree(dir: &Path, files: &[(&str, &[u8])]) -> anyhow::Result<()> {
    for (rel, bytes) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `wisp-sdk`'s manifest as a crate of its own: the SDK's `Cargo.toml` without the
/// workspace's lint table (the only thing it takes from the workspace).
pub(crate) fn standalone_sdk_manifest() -> String {
    SDK_RUST_MANIFEST.replace("\n[lints]\nworkspace = true\n", "\n")
}

/// Writes the Rust SDK crate (manifest, README, sources and its own `wit/`) into `dir`.
pub(crate) fn write_rust_sdk(dir: &Path) -> anyhow::Result<()> {
    write_tree(
        dir,
        &[
            ("Cargo.toml", standalone_sdk_manifest().as_bytes()),
            ("README.md", SDK_RUST_README.as_bytes()),
        ],
    )?;
    write_tree(&dir.join("src"), SDK_RUST_SRC)?;
    // What the packaged crate holds of its `wit/` (its manifest's `include`): the `.wit` files.
    let wit: Vec<(&str, &[u8])> = WIT
        .iter()
        .copied()
        .filter(|(rel, _)| rel.ends_with(".wit"))
        .collect();
    write_tree(&dir.join("wit"), &wit)
}

/// The project's `sub` directory if it has one, else the embedded `files` written into a
/// fresh directory under `scratch`.
fn own_or_embedded(
    project: &Path,
    sub: &str,
    files: &[(&str, &[u8])],
    scratch: &Path,
) -> anyhow::Result<PathBuf> {
    let own = project.join(sub);
    if own.is_dir() {
        return Ok(own);
    }
    let dir = scratch.join(sub);
    write_tree(&dir, files)?;
    Ok(dir)
}

/// The WIT directory a build uses: the project's `wit/`, else the embedded one.
pub(crate) fn wit_dir(project: &Path, scratch: &Path) -> anyhow::Result<PathBuf> {
    own_or_embedded(project, "wit", WIT, scratch)
}

/// The SDK directory a Python or JS build uses: the project's `wisp-sdk/`, else the embedded
/// one for `lang_files`.
pub(crate) fn sdk_dir(
    project: &Path,
    files: &[(&str, &[u8])],
    scratch: &Path,
) -> anyhow::Result<PathBuf> {
    own_or_embedded(project, "wisp-sdk", files, scratch)
}

/// Whether `program` runs (`program --version` exits 0).
fn runs(program: &Path) -> bool {
    Process::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd`, failing with its name and exit status.
pub(crate) fn spawn(mut cmd: Process) -> anyhow::Result<()> {
    let what = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {what} (is it installed?)"))?;
    anyhow::ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

/// Makes sure `cargo` can build for `wasm32-wasip2`: adds the target with rustup when it is
/// missing, or names the commands to run.
pub(crate) fn ensure_rust_target(cargo: &Path) -> anyhow::Result<()> {
    if !runs(cargo) {
        bail!(
            "cargo is needed to build Rust plugins: install Rust from https://rustup.rs, then run \
             `rustup target add wasm32-wasip2`"
        );
    }
    let installed = Process::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match installed {
        Ok(out) if out.status.success() => {
            if !String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == "wasm32-wasip2")
            {
                eprintln!("wisp plugin: adding the wasm32-wasip2 target (rustup target add wasm32-wasip2)");
                let mut add = Process::new("rustup");
                add.args(["target", "add", "wasm32-wasip2"]);
                spawn(add)?;
            }
            Ok(())
        }
        // Without rustup the toolchain may still have the target; cargo says so if not.
        _ => Ok(()),
    }
}

/// The `componentize-py` to run: `WISP_COMPONENTIZE_PY`, else the one Wisp installed into its
/// tools directory before (when that directory is this user's own), else one on `PATH`, else
/// installed into the tools directory now with `python3` (from PyPI, pinned by hash), else an
/// error naming the command to run.
pub(crate) fn componentize_py() -> anyhow::Result<PathBuf> {
    if let Some(given) = std::env::var_os("WISP_COMPONENTIZE_PY") {
        return Ok(PathBuf::from(given));
    }
    let tools = tools_dir()?;
    let venv = tools.join("python");
    let tool = venv.join("bin/componentize-py");
    if tool.exists() {
        ours(&tools)?;
        ours(&venv)?;
        if runs(&tool) {
            return Ok(tool);
        }
    }
    let on_path = PathBuf::from("componentize-py");
    if runs(&on_path) {
        return Ok(on_path);
    }
    let python = PathBuf::from("python3");
    anyhow::ensure!(
        runs(&python),
        "componentize-py is needed to build Python plugins: run `python3 -m pip install \
         '{COMPONENTIZE_PY}'` (or set WISP_COMPONENTIZE_PY to its path)"
    );
    eprintln!(
        "wisp plugin: downloading {COMPONENTIZE_PY} from PyPI (pip's index), pinned by the \
         SHA-256 of its wheels, into {} (once)",
        venv.display()
    );
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&tools)
        .with_context(|| format!("cannot create {}", tools.display()))?;
    ours(&tools)?;
    let mut make = Process::new(&python);
    make.args(["-m", "venv"]).arg(&venv);
    let requirements = tools.join("componentize-py.requirements.txt");
    std::fs::write(&requirements, COMPONENTIZE_PY_PINNED)
        .with_context(|| format!("cannot write {}", requirements.display()))?;
    let mut install = Process::new(venv.join("bin/python"));
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--require-hashes",
            "--only-binary=:all:",
            "--no-deps",
            "-r",
        ])
        .arg(&requirements);
    spawn(make).and_then(|()| spawn(install)).with_context(|| {
        format!(
            "cannot install componentize-py: run `python3 -m pip install '{COMPONENTIZE_PY}'` \
                 (or set WISP_COMPONENTIZE_PY to its path)"
        )
    })?;
    Ok(tool)
}

/// Refuses a tools directory that is not this user's own (a link, another user's, or one
/// others may write into): what runs from it builds the plugins the server will load.
fn ours(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot inspect {}", dir.display()))?;
    #[expect(
        unsafe_code,
        reason = "geteuid reads the process's user and cannot fail"
    )]
    // SAFETY: no arguments, no memory.
    let me = unsafe { libc::geteuid() };
    let why = if meta.file_type().is_symlink() {
        Some("it is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("it is not a directory".to_string())
    } else if meta.uid() != me {
        Some(format!(
            "it belongs to user {}, not to you ({me})",
            meta.uid()
        ))
    } else if meta.permissions().mode() & 0o022 != 0 {
        Some(format!(
            "others may write into it (mode {:o})",
            meta.permissions().mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => bail!(
            "wisp plugin will not run tools from {}: {why}; remove it, or set WISP_TOOLS_DIR",
            dir.display()
        ),
        None => Ok(()),
    }
}

/// Where `wisp plugin` keeps the tools it installs: `$WISP_TOOLS_DIR`, else
/// `$XDG_CACHE_HOME/wisp/tools`, else `~/.cache/wisp/tools`.
fn tools_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("WISP_TOOLS_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither WISP_TOOLS_DIR, XDG_CACHE_HOME nor HOME is set: set WISP_TOOLS_DIR")?;
    Ok(cache.join("wisp/tools"))
}

/// Makes sure the JS project in `project` has componentize-js: Node.js and npm must be
/// there; the packages are installed with `npm ci` from the project's lock file.
pub(crate) fn ensure_componentize_js(project: &Path) -> anyhow::Result<()> {
    for tool in ["node", "npm"] {
        anyhow::ensure!(
            runs(Path::new(tool)),
            "Node.js 18+ and npm are needed to build JavaScript plugins: install them (Debian: \
             `apt-get install nodejs npm`)"
        );
    }
    if project
        .join("node_modules/@bytecodealliance/componentize-js")
        .is_dir()
    {
        return Ok(());
    }
    // A project made before it carried the SDK's package files gets them now.
    if !project.join("package.json").is_file() {
        let files: Vec<(&str, &[u8])> = SDK_JS
            .iter()
            .copied()
            .filter(|(rel, _)| matches!(*rel, "package.json" | "package-lock.json" | ".npmrc"))
            .collect();
        write_tree(project, &files)?;
    }
    eprintln!(
        "wisp plugin: downloading @bytecodealliance/componentize-js and its dependencies from \
         the npm registry, at the versions and integrity hashes of package-lock.json, into {} \
         (npm ci, no install scripts)",
        project.join("node_modules").display()
    );
    // None of componentize-js's packages needs an install script (the lock file marks none):
    // they are not run.
    let mut npm = Process::new("npm");
    npm.args([
        "ci",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ])
    .current_dir(project);
    spawn(npm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded trees hold what the SDKs need, and nothing built.
    /// What `npm ci --ignore-scripts` leaves out is nothing componentize-js needs, and the
    /// pinned componentize-py is the release the SDK is tested with.
    #[test]
    fn the_toolchain_installs_pinned_files_and_runs_no_install_scripts() {
        let lock = SDK_JS
            .iter()
            .find(|(rel, _)| *rel == "package-lock.json")
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .expect("the JS SDK carries its lock file");
        assert!(!lock.contains("\"hasInstallScript\": true"));
        assert!(COMPONENTIZE_PY_PINNED.starts_with(COMPONENTIZE_PY));
        assert_eq!(COMPONENTIZE_PY_PINNED.matches("--hash=sha256:").count(), 5);
    }

    #[test]
    fn a_tools_directory_that_is_not_ours_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ours(&open).unwrap_err().to_string();
        assert!(e.contains("others may write"), "{e}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        let e = ours(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        ours(&open).unwrap();
    }

    #[test]
    fn the_binary_carries_the_wit_and_every_sdk() {
        let names = |t: &[(&str, &[u8])]| t.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>();
        let wit = names(WIT);
        for f in [
            "plugin.wit",
            "deps/wisp-plugin-0.1.0/plugin.wit",
            "deps/wasi-nn/wasi-nn.wit",
        ] {
            assert!(wit.contains(&f.to_string()), "{f} in {wit:?}");
        }
        assert!(names(SDK_RUST_SRC).contains(&"lib.rs".to_string()));
        let py = names(SDK_PYTHON);
        for f in [
            "wisp_app.py",
            "triton_python_backend_utils.py",
            "wisp/__init__.py",
        ] {
            assert!(py.contains(&f.to_string()), "{f} in {py:?}");
        }
        assert!(py.iter().all(|n| !n.contains("__pycache__")));
        let js = names(SDK_JS);
        for f in ["wisp.js", "build.mjs", "package.json", "package-lock.json"] {
            assert!(js.contains(&f.to_string()), "{f} in {js:?}");
        }
        assert!(js.iter().all(|n| !n.starts_with("node_modules")));
    }

    /// The standalone SDK manifest keeps the workspace's version and names no workspace.
    #[test]
    fn the_sdk_manifest_stands_alone() {
        let m = standalone_sdk_manifest();
        assert!(
            !m.contains("workspace = true") && !m.contains(".workspace"),
            "{m}"
        );
        assert!(!m.contains("[lints]"), "{m}");
        assert!(
            m.contains(&format!("version = \"{}\"", env!("CARGO_PKG_VERSION"))),
            "{m}"
        );
    }
}
