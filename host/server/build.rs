//! Compiles the gRPC service (`proto/grpc_service.proto`, which imports the model config schema
//! from `../core/proto`) with protox + tonic-prost-build: no system `protoc` needed; and
//! embeds the plugin toolchain's WIT and SDK sources (`wisp plugin`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    embed_plugin_kit()?;
    stamp_commit();
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    println!("cargo:rerun-if-changed=../core/proto/model_config.proto");
    let fds = protox::compile(["grpc_service.proto"], ["proto", "../core/proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .build_transport(false)
        // prost's codec, with infer requests charged to the budget before they are decoded
        .codec_path("crate::grpc::codec::BudgetCodec")
        // tensor payloads as `Bytes`: slicing, no copies
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_fds(fds)?;
    Ok(())
}

/// `WISP_COMMIT` for `wisp --version`: `$WISP_BUILD_COMMIT` when set (a build from a tarball),
/// else the checkout's `git rev-parse --short=12 HEAD`, else "unknown". Reruns when HEAD or the
/// branch it names moves (only files that exist are watched: a missing one would rerun every
/// build).
fn stamp_commit() {
    println!("cargo:rerun-if-env-changed=WISP_BUILD_COMMIT");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = root.join(".git");
    let head = git.join("HEAD");
    if head.is_file() {
        println!("cargo:rerun-if-changed={}", head.display());
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(r) = text.trim().strip_prefix("ref: ") {
                let branch = git.join(r);
                if branch.is_file() {
                    println!("cargo:rerun-if-changed={}", branch.display());
                }
            }
        }
        let packed = git.join("packed-refs");
        if packed.is_file() {
            println!("cargo:rerun-if-changed={}", packed.display());
        }
    }
    let commit = std::env::var("WISP_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .current_dir(&root)
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WISP_COMMIT={commit}");
    // The wasmtime the lock file pins (the plugin runtime's), for the same report.
    let lock = root.join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let wasmtime = std::fs::read_to_string(&lock)
        .ok()
        .and_then(|text| {
            let at = text.find("\nname = \"wasmtime\"\nversion = \"")?;
            let rest = &text[at + "\nname = \"wasmtime\"\nversion = \"".len()..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WISP_WASMTIME={wasmtime}");
    println!(
        "cargo:rustc-env=WISP_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
}

/// Embeds the plugin toolchain's sources (the WIT package and the Rust, Python and JS SDKs)
/// so that `wisp plugin new` and `build` work from the binary alone: writes
/// `$OUT_DIR/plugin_kit.rs` with one sorted `(relative path, bytes)` table per tree.
fn embed_plugin_kit() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize()?;
    let trees = [
        ("WIT", root.join("wit")),
        ("SDK_RUST_SRC", root.join("sdk/src")),
        ("SDK_PYTHON", root.join("sdk/python")),
        ("SDK_JS", root.join("sdk/js")),
    ];
    let mut out = String::new();
    for (name, dir) in &trees {
        let mut files = Vec::new();
        walk(dir, dir, &mut files)?;
        files.sort();
        // Each file, and the directory for files added, except sdk/js: cargo scans a directory
        // whole, and it holds node_modules.
        if *name != "SDK_JS" {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        for (_, abs) in &files {
            println!("cargo:rerun-if-changed={abs}");
        }
        out.push_str(&format!(
            "pub(crate) static {name}: &[(&str, &[u8])] = &[\n"
        ));
        for (rel, abs) in files {
            out.push_str(&format!("    ({rel:?}, include_bytes!({abs:?})),\n"));
        }
        out.push_str("];\n");
    }
    for (name, file) in [
        ("SDK_RUST_MANIFEST", "sdk/Cargo.toml"),
        ("SDK_RUST_README", "sdk/README.md"),
    ] {
        let abs = root.join(file);
        println!("cargo:rerun-if-changed={}", abs.display());
        out.push_str(&format!(
            "pub(crate) static {name}: &str = include_str!({:?});\n",
            abs.display().to_string()
        ));
    }
    let dest = std::path::Path::new(&std::env::var("OUT_DIR")?).join("plugin_kit.rs");
    std::fs::write(dest, out)?;
    Ok(())
}

/// The files under `dir` as (path relative to `base` with `/`, absolute path), leaving out
/// build products (`node_modules`, `__pycache__`, dotfiles other than `.npmrc`).
fn walk(
    base: &std::path::Path,
    dir: &std::path::Path,
    out: &mut Vec<(String, String)>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "node_modules" | "__pycache__")
            || (name.starts_with('.') && name != ".npmrc")
            || name.ends_with(".pyc")
        {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            walk(base, &path, out)?;
        } else if path.is_file() {
            let rel = path.strip_prefix(base).map_err(std::io::Error::other)?;
            let rel = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path.display().to_string()));
        }
    }
    Ok(())
}
