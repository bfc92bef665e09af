//! Compiles the gRPC service (`proto/grpc_service.proto`, which imports the model config schema
//! from `../core/proto`) with protox + tonic-prost-build: no system `protoc` needed; and
//! embeds the plugin toolchain's WIT and SDK sources (`wisp plugin`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    embed_plugin_kit()?;
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
