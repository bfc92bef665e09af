//! `wisp plugin`: scaffold, build, check and run plugins without a server.
//!
//! - `new NAME --lang rust|python|js` writes a buildable plugin project with a test, its own
//!   copy of the WIT package and of the language's SDK (all carried in the binary: `kit`);
//! - `build DIR` builds it into `<out>/<name>/1/model.wasm` (a repository layout), installing
//!   what it can of the language's tools;
//! - `check FILE` compiles and links a component as a load would, and prints its world, its
//!   imports with what the sandbox makes of them, and what it describes;
//! - `run FILE --input NAME=JSON|@FILE` executes one request in a sandboxed instance.
//!
//! Building needs the language's tools: `cargo` (the `wasm32-wasip2` target is added with
//! rustup), `componentize-py` (installed from PyPI with `python3` when missing), or Node.js and
//! npm (componentize-js is installed into the project with `npm ci`). No Wisp source tree is
//! needed.

mod kit;
mod templates;

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use wisp_core::backend::{Backend, LoadedModel};
use wisp_core::config::{self, ModelConfig, Signature};
use wisp_core::{DataType, InferRequest, Tensor};
use wisp_plugin_runtime::{WasmBackend, WasmOptions};

/// `wisp plugin` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PluginCommand {
    /// Scaffold a plugin project: source, a test and a config.pbtxt.
    New {
        /// The plugin's name (also its directory's).
        name: String,
        /// Its language.
        #[arg(long, value_enum)]
        lang: Lang,
        /// Where to create the project directory (default: the current directory).
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: PathBuf,
    },
    /// Build a plugin project into `<out>/<name>/1/model.wasm` (with its config.pbtxt).
    Build {
        /// The project directory (`Cargo.toml`, `model.py` or `plugin.js`).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// The repository to write into (default: `<dir>/build`).
        #[arg(long, value_name = "REPO")]
        out: Option<PathBuf>,
    },
    /// Compile and link a component as the server would; print its world, imports and
    /// signature. Fails when the server could not load it.
    Check {
        /// The component (`model.wasm`).
        file: PathBuf,
    },
    /// Execute one request locally in a sandboxed instance (no server; model calls fail).
    Run {
        /// The component (`model.wasm`).
        file: PathBuf,
        /// The model's config (default: `config.pbtxt` two directories up, as in a repository,
        /// else what the plugin describes).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// An input: `NAME=JSON` (a list of values, nested as the shape, or one value) or
        /// `NAME=@FILE` (a BYTES element holding the file).
        #[arg(long = "input", value_name = "NAME=VALUE")]
        inputs: Vec<String>,
    },
}

/// A plugin language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust with `wisp-sdk`.
    Rust,
    /// Python with componentize-py and the `wisp` package.
    Python,
    /// JavaScript with componentize-js.
    Js,
}

/// Runs one `wisp plugin` command.
pub fn run(cmd: PluginCommand) -> anyhow::Result<()> {
    match cmd {
        PluginCommand::New { name, lang, dir } => new(&name, lang, &dir),
        PluginCommand::Build { dir, out } => {
            let out = out.unwrap_or_else(|| dir.join("build"));
            let file = build(&dir, &out)?;
            println!("built {}", file.display());
            Ok(())
        }
        PluginCommand::Check { file } => check(&file),
        PluginCommand::Run {
            file,
            config,
            inputs,
        } => run_once(&file, config.as_deref(), &inputs),
    }
}

/// A name usable as a model, a directory and (with `_`) a Rust crate.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    anyhow::ensure!(
        ok,
        "plugin name '{name}': use lower-case letters, digits, '-' and '_', starting with a letter"
    );
    Ok(())
}

fn new(name: &str, lang: Lang, dir: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    let project = dir.join(name);
    anyhow::ensure!(
        !project.exists(),
        "{} already exists: pick another name or directory",
        project.display()
    );
    let named = |t: &str| {
        t.replace("@NAME@", name)
            .replace("@TYPE@", &templates::type_name(name))
    };
    let (steps, files): (&str, Vec<(&str, String)>) = match lang {
        Lang::Rust => (
            "cargo test                                            # the logic, natively",
            vec![
                ("Cargo.toml", named(templates::RUST_MANIFEST)),
                ("src/lib.rs", named(templates::RUST)),
                (".gitignore", "/target\n/build\n".into()),
            ],
        ),
        Lang::Python => (
            "python3 -m pytest                                     # the logic, natively",
            vec![
                ("model.py", named(templates::PYTHON)),
                ("test_model.py", templates::PYTHON_TEST.into()),
                ("conftest.py", templates::PYTHON_CONFTEST.into()),
                (".gitignore", "/build\n__pycache__/\n".into()),
            ],
        ),
        Lang::Js => (
            "npm ci                                                # componentize-js (build runs it too)",
            vec![
                ("plugin.js", named(templates::JS)),
                (".gitignore", "/build\n/node_modules\n".into()),
            ],
        ),
    };
    let readme = named(templates::README).replace("@STEPS@", steps);
    let mut text: Vec<(&str, &[u8])> = files.iter().map(|(p, t)| (*p, t.as_bytes())).collect();
    text.push(("README.md", readme.as_bytes()));
    kit::write_tree(&project, &text)?;
    kit::write_tree(&project.join("wit"), kit::WIT)?;
    let sdk = project.join("wisp-sdk");
    match lang {
        Lang::Rust => kit::write_rust_sdk(&sdk)?,
        Lang::Python => kit::write_tree(&sdk, kit::SDK_PYTHON)?,
        Lang::Js => {
            let (package, module): (Vec<_>, Vec<_>) =
                kit::SDK_JS.iter().copied().partition(|(rel, _)| {
                    matches!(*rel, "package.json" | "package-lock.json" | ".npmrc")
                });
            kit::write_tree(&project, &package)?;
            kit::write_tree(&sdk, &module)?;
        }
    }
    println!(
        "created {} ({lang:?}); build it with: wisp plugin build {}",
        project.display(),
        project.display()
    );
    Ok(())
}

fn build(dir: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("the project directory has no name")?;
    let target = out.join(&name).join("1");
    std::fs::create_dir_all(&target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let wasm = std::path::absolute(target.join("model.wasm"))?;
    // The embedded WIT and SDKs go here for a project that has no copies of its own.
    let scratch = tempfile::tempdir()?;
    if dir.join("Cargo.toml").is_file() {
        let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        kit::ensure_rust_target(&cargo)?;
        let mut cmd = Process::new(&cargo);
        cmd.args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"));
        kit::spawn(cmd)?;
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("target"));
        let crate_name = cargo_package_name(&dir.join("Cargo.toml"))?.replace('-', "_");
        let built = target_dir
            .join("wasm32-wasip2/release")
            .join(format!("{crate_name}.wasm"));
        std::fs::copy(&built, &wasm).with_context(|| format!("cannot copy {}", built.display()))?;
    } else if dir.join("model.py").is_file() {
        let tool = kit::componentize_py()?;
        let mut cmd = Process::new(tool);
        cmd.arg("-d")
            .arg(kit::wit_dir(&dir, scratch.path())?)
            .args([
                "-w",
                "wisp:plugin/model@0.3.0",
                "componentize",
                "wisp_app",
                "-p",
            ])
            .arg(kit::sdk_dir(&dir, kit::SDK_PYTHON, scratch.path())?)
            .arg("-p")
            .arg(&dir)
            .arg("-o")
            .arg(&wasm);
        kit::spawn(cmd)?;
    } else if dir.join("plugin.js").is_file() {
        kit::ensure_componentize_js(&dir)?;
        // build.mjs must sit inside the project to resolve its componentize-js.
        let sdk = kit::sdk_dir(&dir, kit::SDK_JS, &dir.join("node_modules/.wisp"))?;
        let mut cmd = Process::new("node");
        cmd.arg(sdk.join("build.mjs"))
            .arg(dir.join("plugin.js"))
            .arg(&wasm)
            .arg(kit::wit_dir(&dir, scratch.path())?);
        kit::spawn(cmd)?;
    } else {
        bail!(
            "{}: no Cargo.toml, model.py or plugin.js: not a plugin project",
            dir.display()
        );
    }
    let cfg = dir.join("config.pbtxt");
    if cfg.is_file() {
        std::fs::copy(&cfg, out.join(&name).join("config.pbtxt"))?;
    }
    Ok(wasm)
}

/// `package.name` of a Cargo manifest (read line by line: templates keep it simple).
fn cargo_package_name(manifest: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(manifest)?;
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("name").map(str::trim))
        .and_then(|l| l.strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
        .with_context(|| format!("{}: no package name", manifest.display()))
}

fn check(file: &Path) -> anyhow::Result<()> {
    let backend = WasmBackend::new(WasmOptions::default(), None);
    let i = backend
        .inspect(file)
        .map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.message()))?;
    println!("{}: {} bytes", file.display(), i.bytes);
    println!(
        "world: {}",
        i.world
            .unwrap_or("none (it exports no wisp:plugin/plugin: not a Wisp plugin)")
    );
    println!("imports:");
    for (name, note) in &i.imports {
        println!("  {name}: {note}");
    }
    match &i.signature {
        Some(io) => {
            println!(
                "describes itself: max_batch_size {}",
                io.max_batch_size.unwrap_or(0)
            );
            for (kind, list) in [("input", &io.inputs), ("output", &io.outputs)] {
                for t in list {
                    let dt = t.datatype.map_or("?", |d| d.as_str());
                    println!("  {kind} {} {dt} {:?}", t.name, t.shape);
                }
            }
        }
        None if i.world.is_some_and(|w| w != "wisp:plugin@0.1.0") && i.link_error.is_none() => {
            println!("does not describe itself: its config.pbtxt must declare inputs and outputs")
        }
        None => {}
    }
    if let Some(e) = &i.link_error {
        bail!("{}: the server would not load it: {e}", file.display());
    }
    anyhow::ensure!(
        i.world.is_some(),
        "{}: not a wisp:plugin component",
        file.display()
    );
    println!("ok");
    Ok(())
}

/// The config `run` uses: the given file, the repository's, or the plugin's own description.
fn run_config(
    file: &Path,
    given: Option<&Path>,
    backend: &WasmBackend,
) -> anyhow::Result<ModelConfig> {
    let beside = file
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("config.pbtxt"));
    let path = given
        .map(Path::to_path_buf)
        .or_else(|| beside.filter(|p| p.is_file()));
    let mut cfg = match &path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            config::parse_pbtxt("plugin", &text).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => ModelConfig {
            name: "plugin".into(),
            ..Default::default()
        },
    };
    cfg.backend = config::WASM_BACKEND.into();
    if cfg.input.is_empty() || cfg.output.is_empty() {
        let io = backend
            .describe(file)
            .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        config::autocomplete(&mut cfg, &io);
    }
    Ok(cfg)
}

/// One input from `NAME=JSON` or `NAME=@FILE`, shaped by the config.
fn parse_input(arg: &str, sig: &Signature) -> anyhow::Result<Tensor> {
    let (name, value) = arg
        .split_once('=')
        .with_context(|| format!("--input {arg}: expected NAME=JSON or NAME=@FILE"))?;
    let spec = sig.input(name).with_context(|| {
        format!(
            "--input {name}: the model's inputs are {}",
            sig.input_names()
        )
    })?;
    let dt = spec.datatype;
    let values: Vec<serde_json::Value> = match value.strip_prefix('@') {
        Some(path) => {
            anyhow::ensure!(
                dt == DataType::Bytes,
                "--input {name}=@FILE: only BYTES inputs take a file"
            );
            let bytes = std::fs::read(path).with_context(|| format!("cannot read {path}"))?;
            let t = Tensor::new(
                name,
                dt,
                batch_shape(sig.batches(), &spec.dims, 1)?,
                wisp_core::tensor::encode_bytes_elements([bytes.as_slice()]).into(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            return Ok(t);
        }
        None => {
            let v: serde_json::Value =
                serde_json::from_str(value).with_context(|| format!("--input {name}: not JSON"))?;
            let mut flat = Vec::new();
            flatten(v, &mut flat);
            flat
        }
    };
    let shape = batch_shape(sig.batches(), &spec.dims, values.len())?;
    let text = serde_json::Value::Array(values.clone()).to_string();
    let data = crate::http::codec::json_data_decode(dt, &text, values.len())
        .map_err(|e| anyhow::anyhow!("--input {name}: {}", e.message()))?;
    Tensor::new(name, dt, shape, data.into()).map_err(|e| anyhow::anyhow!("--input {name}: {e}"))
}

fn flatten(v: serde_json::Value, out: &mut Vec<serde_json::Value>) {
    match v {
        serde_json::Value::Array(a) => a.into_iter().for_each(|x| flatten(x, out)),
        other => out.push(other),
    }
}

/// A shape for `n` elements: a batch of one (when the model batches) and the config's dims,
/// with one variable dimension taking what is left.
fn batch_shape(batches: bool, dims: &[i64], n: usize) -> anyhow::Result<Vec<i64>> {
    let fixed: i64 = dims.iter().filter(|&&d| d >= 0).product();
    let variable = dims.iter().filter(|&&d| d < 0).count();
    let mut shape: Vec<i64> = dims
        .iter()
        .map(|&d| if d < 0 { (n as i64) / fixed.max(1) } else { d })
        .collect();
    anyhow::ensure!(
        variable <= 1,
        "more than one variable dimension in {dims:?}: cannot tell the shape"
    );
    if batches {
        shape.insert(0, 1);
    }
    let count: i64 = shape.iter().product();
    anyhow::ensure!(
        count == n as i64,
        "{n} values do not fill the shape {shape:?}"
    );
    Ok(shape)
}

fn run_once(file: &Path, config: Option<&Path>, inputs: &[String]) -> anyhow::Result<()> {
    let backend = WasmBackend::new(WasmOptions::default(), None);
    let cfg = run_config(file, config, &backend)?;
    let sig = Signature::of(&cfg).map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    let request = InferRequest {
        inputs: inputs
            .iter()
            .map(|a| parse_input(a, &sig))
            .collect::<anyhow::Result<_>>()?,
        ..Default::default()
    };
    wisp_core::infer::validate(&request, &sig).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    // One plugin run directly, with the sandbox its config asks for and no scheduler.
    let model_dir = file
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    let sandbox = config::params::Sandbox::of(&cfg, model_dir)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    let spec = config::ModelSpec {
        config: std::sync::Arc::new(cfg),
        steps: std::sync::Arc::from([]),
        sequence: None,
        params: std::sync::Arc::new(config::params::Params {
            sandbox: Some(sandbox),
            ..Default::default()
        }),
        signature: std::sync::Arc::new(sig),
        file_sha256: None,
    };
    let loaded = backend
        .load(&spec, file)
        .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    let mut instance =
        LoadedModel::new_instance(&*loaded, 0).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    let mut results = instance.execute(&[request], &mut Default::default());
    let response = results
        .pop()
        .context("the plugin returned nothing")?
        .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    let outputs: Vec<serde_json::Value> = response
        .outputs
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "datatype": t.datatype.as_str(),
                "shape": t.shape,
                "data": crate::http::codec::tensor_to_json(t),
            })
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({ "outputs": outputs }))?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("text-norm_2").is_ok());
        for bad in ["", "Upper", "../x", "a b", "9x", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shapes_take_the_batch_and_one_variable_dimension() {
        assert_eq!(batch_shape(true, &[2, -1], 6).unwrap(), vec![1, 2, 3]);
        assert_eq!(batch_shape(false, &[2, -1], 6).unwrap(), vec![2, 3]);
        assert!(batch_shape(true, &[2], 3).is_err());
        assert!(batch_shape(true, &[-1, -1], 4).is_err());
    }
}
