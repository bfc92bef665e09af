//! `wisp plugin`: scaffold, build, check and run plugins without a server.
//!
//! - `new NAME --lang rust|python|js` writes a buildable plugin with a test and a
//!   `config.pbtxt`;
//! - `build DIR` builds it into `<out>/<name>/1/model.wasm` (a repository layout);
//! - `check FILE` compiles and links a component as a load would, and prints its world, its
//!   imports with what the sandbox makes of them, and what it describes;
//! - `run FILE --input NAME=JSON|@FILE` executes one request in a sandboxed instance.
//!
//! Building needs the language's tools: `cargo` with the `wasm32-wasip2` target, or
//! `componentize-py`, or Node.js with `sdk/js`'s packages; they and the WIT and SDKs are found
//! in the Wisp source tree (`--wisp-root`, `WISP_ROOT`, or the nearest parent directory that
//! holds `wit/plugin.wit`).

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
        /// The Wisp source tree (for the SDK path a Rust project depends on; else `WISP_ROOT`,
        /// else found upwards from here).
        #[arg(long, value_name = "DIR")]
        wisp_root: Option<PathBuf>,
    },
    /// Build a plugin project into `<out>/<name>/1/model.wasm` (with its config.pbtxt).
    Build {
        /// The project directory (`Cargo.toml`, `model.py` or `plugin.js`).
        dir: PathBuf,
        /// The repository to write into (default: `<dir>/build`).
        #[arg(long, value_name = "REPO")]
        out: Option<PathBuf>,
        /// The Wisp source tree (WIT, SDKs, tools; else `WISP_ROOT`, else found upwards).
        #[arg(long, value_name = "DIR")]
        wisp_root: Option<PathBuf>,
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
        PluginCommand::New {
            name,
            lang,
            dir,
            wisp_root,
        } => new(&name, lang, &dir, wisp_root),
        PluginCommand::Build {
            dir,
            out,
            wisp_root,
        } => {
            let out = out.unwrap_or_else(|| dir.join("build"));
            let file = build(&dir, &out, wisp_root)?;
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

/// The Wisp source tree: given, or the nearest parent of the current directory (or of the
/// executable) holding `wit/plugin.wit`.
fn wisp_root(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let given = given.or_else(|| std::env::var_os("WISP_ROOT").map(PathBuf::from));
    if let Some(root) = given {
        anyhow::ensure!(
            root.join("wit/plugin.wit").is_file(),
            "{} is not a Wisp source tree (no wit/plugin.wit)",
            root.display()
        );
        return Ok(std::fs::canonicalize(root)?);
    }
    let starts = [std::env::current_dir().ok(), std::env::current_exe().ok()];
    for start in starts.into_iter().flatten() {
        let mut at = Some(start.as_path());
        while let Some(dir) = at {
            if dir.join("wit/plugin.wit").is_file() {
                return Ok(dir.to_path_buf());
            }
            at = dir.parent();
        }
    }
    bail!("cannot find the Wisp source tree (wit/plugin.wit): pass --wisp-root or set WISP_ROOT")
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

const CONFIG: &str = r#"backend: "wasm"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ 1 ] } ]
"#;

fn new(name: &str, lang: Lang, dir: &Path, root: Option<PathBuf>) -> anyhow::Result<()> {
    check_name(name)?;
    let project = dir.join(name);
    anyhow::ensure!(
        !project.exists(),
        "{} already exists: pick another name or directory",
        project.display()
    );
    let mut files: Vec<(PathBuf, String)> = vec![(project.join("config.pbtxt"), CONFIG.into())];
    match lang {
        Lang::Rust => {
            let sdk = wisp_root(root)?.join("sdk");
            files.push((
                project.join("Cargo.toml"),
                format!(
                    r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"

[lib]
crate-type = ["cdylib"]

[dependencies]
wisp-sdk = {{ path = "{}" }}

[profile.release]
opt-level = 3
lto = true
strip = "debuginfo"

# its own workspace, wherever it is created
[workspace]
"#,
                    sdk.display()
                ),
            ));
            files.push((
                project.join("src/lib.rs"),
                RUST_TEMPLATE.replace("NAME", name),
            ));
        }
        Lang::Python => {
            files.push((
                project.join("model.py"),
                PYTHON_TEMPLATE.replace("NAME", name),
            ));
            files.push((project.join("test_model.py"), PYTHON_TEST.into()));
        }
        Lang::Js => {
            files.push((project.join("plugin.js"), JS_TEMPLATE.replace("NAME", name)));
        }
    }
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!(
        "created {} ({lang:?}); build it with: wisp plugin build {}",
        project.display(),
        project.display()
    );
    Ok(())
}

/// Runs `cmd`, failing with its name and exit status.
fn spawn(mut cmd: Process) -> anyhow::Result<()> {
    let what = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {what} (is it installed?)"))?;
    anyhow::ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

fn build(dir: &Path, out: &Path, root: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().replace('-', "_"))
        .context("the project directory has no name")?;
    let target = out.join(&name).join("1");
    std::fs::create_dir_all(&target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let wasm = target.join("model.wasm");
    if dir.join("Cargo.toml").is_file() {
        let mut cmd = Process::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"));
        spawn(cmd)?;
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("target"));
        let crate_name = cargo_package_name(&dir.join("Cargo.toml"))?.replace('-', "_");
        let built = target_dir
            .join("wasm32-wasip2/release")
            .join(format!("{crate_name}.wasm"));
        std::fs::copy(&built, &wasm).with_context(|| format!("cannot copy {}", built.display()))?;
    } else if dir.join("model.py").is_file() {
        let root = wisp_root(root)?;
        let tool = std::env::var_os("WISP_COMPONENTIZE_PY")
            .map(PathBuf::from)
            .or_else(|| {
                let venv = root.join(".venv/bin/componentize-py");
                venv.is_file().then_some(venv)
            })
            .unwrap_or_else(|| "componentize-py".into());
        let mut cmd = Process::new(tool);
        cmd.arg("-d")
            .arg(root.join("wit"))
            .args([
                "-w",
                "wisp:plugin/model@0.2.0",
                "componentize",
                "wisp_app",
                "-p",
            ])
            .arg(root.join("sdk/python"))
            .arg("-p")
            .arg(&dir)
            .arg("-o")
            .arg(&wasm);
        spawn(cmd)?;
    } else if dir.join("plugin.js").is_file() {
        let root = wisp_root(root)?;
        let builder = root.join("sdk/js/build.mjs");
        anyhow::ensure!(
            root.join("sdk/js/node_modules/@bytecodealliance/componentize-js")
                .is_dir(),
            "componentize-js is not installed: run `npm ci` in {}",
            root.join("sdk/js").display()
        );
        let mut cmd = Process::new("node");
        cmd.arg(builder).arg(dir.join("plugin.js")).arg(&wasm);
        spawn(cmd)?;
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
        None if i.world == Some("wisp:plugin@0.2.0") && i.link_error.is_none() => {
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

const RUST_TEMPLATE: &str = r#"//! NAME: a Wisp plugin. `TEXT` (one string per row) -> `UPPER`, upper-cased.

use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};

/// The plugin's state (one per instance).
pub struct Plugin_;

impl Plugin for Plugin_ {
    fn init(_params: &Params) -> Result<Self, Error> {
        Ok(Plugin_)
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let text = request.input("TEXT")?;
        let upper: Vec<String> = text
            .strings()?
            .iter()
            .map(|s| String::from_utf8_lossy(s).to_uppercase())
            .collect();
        Ok(Response::new(vec![Tensor::from_strings("UPPER", text.shape.clone(), upper)]))
    }
}

wisp_sdk::export_plugin!(Plugin_);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_cases() {
        let r = Request::new(vec![Tensor::from_strings("TEXT", vec![1, 1], ["wisp"])]);
        let out = Plugin_.execute(&r).unwrap();
        let upper = out.output("UPPER").unwrap().strings().unwrap();
        assert_eq!(upper, vec![b"WISP".as_slice()]);
    }
}
"#;

const PYTHON_TEMPLATE: &str = r#""""NAME: a Wisp plugin in Triton's Python-backend style. TEXT -> UPPER, upper-cased."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            upper = [s.upper() for s in text.as_strings()]
            out = pb_utils.Tensor("UPPER", upper, "BYTES", text.shape())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"#;

const PYTHON_TEST: &str = r#""""Run with: PYTHONPATH=<wisp>/sdk/python:. python -m pytest"""
import triton_python_backend_utils as pb_utils
from model import TritonPythonModel
from wisp._api import Request


def test_upper_cases():
    t = pb_utils.Tensor("TEXT", [["wisp"]], "BYTES")
    [r] = TritonPythonModel().execute([Request("", [t], [], {})])
    assert pb_utils.get_output_tensor_by_name(r, "UPPER").as_strings() == ["WISP"]
"#;

const JS_TEMPLATE: &str = r#"// NAME: a Wisp plugin in JavaScript. TEXT -> UPPER, upper-cased.
import { definePlugin, Tensor } from 'wisp';

export const plugin = definePlugin({
  execute(request) {
    const text = request.input('TEXT');
    return [Tensor.fromStrings('UPPER', text.shape, text.strings().map((s) => s.toUpperCase()))];
  },
});
"#;

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
