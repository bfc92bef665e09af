//! `wisp-plugin-runtime`: WebAssembly components served as models (`backend: "wasm"`).
//!
//! A plugin is a component of the `wisp:plugin/model` world (`wit/plugin.wit`, 0.3.0; 0.2.0
//! and 0.1.0 components load too): it exports `describe`, `init` and `execute`, may call the
//! server's other models through the `models` import or `wasi:nn`, and, when its config makes
//! it decoupled, sends zero or more responses per request through `responses`. This crate
//! compiles each model version once (caching the precompiled artifact on disk, keyed by the
//! wasmtime version, the engine settings and the component's sha256), links it once into an
//! `InstancePre`, and gives every instance its own store and sandbox:
//!
//! - no filesystem, environment, network or clock unless the config grants them
//!   (see [`limits`] for the `parameters` keys);
//! - a memory cap (`StoreLimits`), a per-call deadline (epoch interruption, ticked by one
//!   thread per engine) and optional fuel;
//! - a trap, deadline or memory exhaustion fails only the requests of that call, is counted in
//!   `wisp_plugin_failure_total{reason}`, and the instance is replaced (a trapped instance
//!   cannot be entered again).
//!
//! `models` and wasi-nn calls reach other models through a [`ModelCaller`] the server
//! provides; a call back into a model on the request's call path is refused.

mod compat;
mod engine;
mod host;
mod instance;
pub mod limits;
mod models;
mod nn;
mod responses;
#[cfg(test)]
mod seams;
mod stdio;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, HasSelf, Linker};
use wisp_core::backend::{Backend, Instance, LoadedModel};
use wisp_core::config::{ModelIo, ModelSpec};
use wisp_core::env::{EnvSource, ProcessEnv};
use wisp_core::{Error, Result};

pub use engine::{CompileSource, Engines, WasmCompiler};
pub use instance::Failure;
pub use limits::Limits;

pub use wisp_core::backend::ModelCaller;

/// Plugin failures by (model, version, reason), for `wisp_plugin_failure_total`.
#[derive(Debug, Default)]
pub struct FailureCounts(Mutex<BTreeMap<(String, String, Failure), u64>>);

impl FailureCounts {
    /// Counts one failure.
    pub fn add(&self, model: &str, version: &str, why: Failure) {
        *self
            .0
            .lock()
            .expect("failure counts lock")
            .entry((model.to_string(), version.to_string(), why))
            .or_default() += 1;
    }

    /// Every count so far: (model, version, reason, count).
    pub fn snapshot(&self) -> Vec<(String, String, Failure, u64)> {
        self.0
            .lock()
            .expect("failure counts lock")
            .iter()
            .map(|((m, v, r), n)| (m.clone(), v.clone(), *r, *n))
            .collect()
    }
}

/// Settings of the wasm backend.
#[derive(Debug, Clone)]
pub struct WasmOptions {
    /// Where precompiled components are cached (`None`: compile on every load).
    pub cache_dir: Option<PathBuf>,
    /// Use wasmtime's pooling instance allocator.
    pub pooling: bool,
    /// What compiles plugins ([`WasmCompiler::host_default`] unless asked).
    pub compiler: WasmCompiler,
    /// Where failures are counted.
    pub failures: Arc<FailureCounts>,
    /// Where the variables `wasm.allow_env` grants are read from.
    pub env: Arc<dyn EnvSource>,
}

impl Default for WasmOptions {
    fn default() -> Self {
        WasmOptions {
            cache_dir: None,
            pooling: true,
            compiler: WasmCompiler::host_default(),
            failures: Arc::default(),
            env: Arc::new(ProcessEnv),
        }
    }
}

/// The `wasm` backend.
pub struct WasmBackend {
    engines: Arc<Engines>,
    caller: Option<Arc<dyn ModelCaller>>,
    failures: Arc<FailureCounts>,
    env: Arc<dyn EnvSource>,
}

/// How long loading one version took, by step (the benchmark reports these).
#[derive(Debug, Clone, Copy)]
pub struct LoadTimes {
    /// Compiling, or loading from the cache.
    pub compile: Duration,
    /// Where the compiled code came from.
    pub source: CompileSource,
    /// Linking imports (`InstancePre`).
    pub link: Duration,
}

impl WasmBackend {
    /// A backend whose plugins call models through `caller` (none: wasi-nn `load-by-name`
    /// reports `unsupported-operation`).
    pub fn new(options: WasmOptions, caller: Option<Arc<dyn ModelCaller>>) -> Self {
        WasmBackend {
            engines: Engines::new(
                options.cache_dir,
                options.pooling,
                options.env.var(engine::PERFMAP_ENV).is_some(),
                options.compiler,
            ),
            caller,
            failures: options.failures,
            env: options.env,
        }
    }

    /// Loads a version and reports where the time went.
    pub fn load_timed(
        &self,
        spec: &ModelSpec,
        model_file: &Path,
    ) -> Result<(WasmModel, LoadTimes)> {
        let config = &*spec.config;
        let name = &config.name;
        let version = model_file
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        // Read and checked with the config; the variables it grants are read now.
        let sandbox = spec.params.sandbox.clone().unwrap_or_default();
        let limits = Limits::new(sandbox, &*self.env);
        if config.input.is_empty() || config.output.is_empty() {
            return Err(Error::invalid(format!(
                "model '{name}': a wasm model declares its inputs and outputs in config.pbtxt, or describes them itself (wisp:plugin@0.2.0 or later: `describe`)"
            )));
        }
        let wasm = wisp_core::repository::read_regular(
            model_file,
            wisp_core::repository::MAX_MODEL_FILE_BYTES,
        )
        .map_err(|e| {
            Error::invalid(format!(
                "model '{name}': cannot read {}: {e}",
                model_file.display()
            ))
        })?;
        // Signed: what compiles is what was signed, not a file swapped after the check.
        if let Some(want) = &spec.file_sha256 {
            use sha2::Digest as _;
            if sha2::Sha256::digest(&wasm).as_slice() != want.as_slice() {
                return Err(Error::invalid(format!(
                    "model '{name}': integrity check failed: {} changed after its signature was checked",
                    model_file.display()
                )));
            }
        }
        let engine = self.engines.get(limits.sandbox.fuel.is_some())?;
        let t0 = Instant::now();
        let (component, source) = self
            .engines
            .compile(engine, &wasm)
            .map_err(|e| e.context(format!("model '{name}' ({})", model_file.display())))?;
        let compile = t0.elapsed();
        let t1 = Instant::now();
        let pre = link(engine, &component, name)?;
        let link = t1.elapsed();
        tracing::info!(model = %name, version, ?source, compile_ms = compile.as_secs_f64() * 1e3, "wasm component ready");
        // A short call may run on the thread that received it unless the config keeps it off
        // (`wasm.on_caller: false`) or its responses are streamed (decoupled: they are sent
        // while it runs). One that calls other models may wait on them there: the scheduler
        // lends it the thread as it would a call that runs long (`Instance::may_stall`).
        let on_caller = limits.sandbox.on_caller && !config.decoupled();
        let shared = instance::Shared {
            on_caller,
            name: name.as_str().into(),
            version,
            config: spec.config.clone(),
            signature: spec.signature.clone(),
            limits,
            pre,
            caller: self.caller.clone(),
            failures: self.failures.clone(),
        };
        Ok((
            WasmModel {
                shared: Arc::new(shared),
            },
            LoadTimes {
                compile,
                source,
                link,
            },
        ))
    }
}

/// Links `component` against everything a plugin may import (WASI 0.2, wasi-nn, and
/// `wisp:plugin` 0.3.0, 0.2.0 and 0.1.0), once per loaded version.
fn link(engine: &wasmtime::Engine, component: &Component, name: &str) -> Result<instance::Pre> {
    let mut linker: Linker<host::State> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| Error::internal(format!("cannot link WASI: {e:#}")))?;
    host::v3::Model::add_to_linker::<_, HasSelf<host::State>>(&mut linker, |s| s)
        .map_err(|e| Error::internal(format!("cannot link wisp:plugin: {e:#}")))?;
    // Older components import their own versions of the interfaces; wasi:nn is linked already.
    let older =
        |e: wasmtime::Error| Error::internal(format!("cannot link wisp:plugin@0.2.0/0.1.0: {e:#}"));
    {
        use host::v2::wisp::plugin0_2_0 as v2;
        v2::types::add_to_linker::<_, HasSelf<host::State>>(&mut linker, |s| s).map_err(older)?;
        v2::logging::add_to_linker::<_, HasSelf<host::State>>(&mut linker, |s| s).map_err(older)?;
        v2::models::add_to_linker::<_, HasSelf<host::State>>(&mut linker, |s| s).map_err(older)?;
    }
    host::v1::wisp::plugin0_1_0::logging::add_to_linker::<_, HasSelf<host::State>>(
        &mut linker,
        |s| s,
    )
    .map_err(older)?;
    let pre = linker.instantiate_pre(component).map_err(|e| {
        Error::invalid(format!(
            "model '{name}': the component's imports cannot be satisfied (a plugin may import wasi:cli/io/clocks/filesystem/random 0.2, wasi:nn, and wisp:plugin/logging, models and responses, 0.1.0 to 0.3.0): {e:#}"
        ))
    })?;
    instance::Pre::new(component, pre)
        .map_err(|e| Error::invalid(format!("model '{name}': {}", e.message())))
}

/// What `wisp plugin check` reports about a component file.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The file's size.
    pub bytes: u64,
    /// The `wisp:plugin` version it implements (`wisp:plugin@0.3.0`, ...), if any.
    pub world: Option<&'static str>,
    /// What it imports, each with what the sandbox makes of it.
    pub imports: Vec<(String, &'static str)>,
    /// Why it cannot be linked (it would not load), if so.
    pub link_error: Option<String>,
    /// What its `describe` says (0.2.0 and later components that describe themselves).
    pub signature: Option<ModelIo>,
}

/// What the sandbox makes of an import, by interface name.
pub fn import_note(name: &str) -> &'static str {
    let iface = name.split('@').next().unwrap_or(name);
    match iface {
        "wisp:plugin/logging" => "granted: lines go to the server's log",
        "wisp:plugin/models" | "wasi:nn/graph" | "wasi:nn/inference" => {
            "granted: calls the server's other models"
        }
        "wisp:plugin/types" | "wasi:nn/tensor" | "wasi:nn/errors" => "types only",
        "wasi:cli/environment" => "empty unless wasm.allow_env grants variables",
        "wasi:cli/stdout" | "wasi:cli/stderr" => "granted: lines go to the server's log",
        "wasi:clocks/wall-clock" | "wasi:clocks/monotonic-clock" => {
            "reads 0 unless wasm.allow_clock is true"
        }
        "wasi:filesystem/types" | "wasi:filesystem/preopens" => {
            "no files unless wasm.allow_read_dir mounts one read-only at /data"
        }
        _ if iface.starts_with("wasi:sockets/") => "linked, but every network use is denied",
        _ if iface.starts_with("wasi:cli/")
            || iface.starts_with("wasi:io/")
            || iface.starts_with("wasi:random/") =>
        {
            "granted"
        }
        _ => "NOT PROVIDED: the server cannot link it, so the component will not load",
    }
}

impl WasmBackend {
    /// Compiles and links `file` as a load would, and reports its world, its imports and what
    /// its `describe` says (`wisp plugin check`).
    pub fn inspect(&self, file: &Path) -> Result<Inspection> {
        let wasm =
            wisp_core::repository::read_regular(file, wisp_core::repository::MAX_MODEL_FILE_BYTES)
                .map_err(|e| Error::invalid(format!("cannot read {}: {e}", file.display())))?;
        let engine = self.engines.get(false)?;
        let (component, _) = self
            .engines
            .compile(engine, &wasm)
            .map_err(|e| e.context(file.display().to_string()))?;
        let world = instance::WORLDS.into_iter().find(|v| {
            component
                .get_export_index(None, format!("wisp:plugin/plugin@{v}"))
                .is_some()
        });
        let imports = component
            .component_type()
            .imports(engine)
            .map(|(name, _)| (name.to_string(), import_note(name)))
            .collect();
        let name = file
            .file_stem()
            .map_or_else(|| "plugin".into(), |s| s.to_string_lossy().into_owned());
        let (link_error, signature) = match link(engine, &component, &name) {
            Err(e) => (Some(e.message().to_string()), None),
            Ok(pre) => match instance::describe(&name, &pre) {
                Ok(sig) => (None, sig.map(signature_io)),
                Err(e) => (Some(e.message().to_string()), None),
            },
        };
        Ok(Inspection {
            bytes: wasm.len() as u64,
            world: world.map(|w| match w {
                "0.3.0" => "wisp:plugin@0.3.0",
                "0.2.0" => "wisp:plugin@0.2.0",
                _ => "wisp:plugin@0.1.0",
            }),
            imports,
            link_error,
            signature,
        })
    }
}

/// A `describe` signature as model-file I/O (the batch dimension as a leading -1).
fn signature_io(sig: host::wit::Signature) -> ModelIo {
    let batched = sig.max_batch_size > 0;
    let spec = |t: host::wit::TensorSpec| {
        let mut shape = Vec::with_capacity(t.dims.len() + 1);
        if batched {
            shape.push(-1);
        }
        shape.extend(t.dims);
        wisp_core::config::IoSpec {
            name: t.name,
            datatype: Some(host::from_wit_datatype(t.datatype)),
            shape,
        }
    };
    ModelIo {
        inputs: sig.inputs.into_iter().map(spec).collect(),
        outputs: sig.outputs.into_iter().map(spec).collect(),
        max_batch_size: Some(sig.max_batch_size),
    }
}

impl Backend for WasmBackend {
    /// What the component's `describe` export says (0.2.0 and later components), for
    /// config auto-complete.
    fn describe(&self, model_file: &Path) -> Result<ModelIo> {
        let name = model_file
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map_or_else(
                || "plugin".to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
        let wasm = wisp_core::repository::read_regular(
            model_file,
            wisp_core::repository::MAX_MODEL_FILE_BYTES,
        )
        .map_err(|e| {
            Error::invalid(format!(
                "model '{name}': cannot read {}: {e}",
                model_file.display()
            ))
        })?;
        let engine = self.engines.get(false)?;
        let (component, _) = self
            .engines
            .compile(engine, &wasm)
            .map_err(|e| e.context(format!("model '{name}' ({})", model_file.display())))?;
        let pre = link(engine, &component, &name)?;
        let Some(sig) = instance::describe(&name, &pre)? else {
            return Err(Error::invalid(format!(
                "model '{name}': the plugin does not describe itself (a wisp:plugin@0.2.0 or later `describe` returning a signature), so config.pbtxt must declare its inputs and outputs"
            )));
        };
        Ok(signature_io(sig))
    }

    fn load(&self, spec: &ModelSpec, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        Ok(Box::new(self.load_timed(spec, model_file)?.0))
    }
}

/// One loaded plugin version.
pub struct WasmModel {
    shared: Arc<instance::Shared>,
}

impl LoadedModel for WasmModel {
    fn engine(&self) -> &str {
        "wasmtime"
    }

    fn new_instance(&self, _index: usize) -> Result<Box<dyn Instance>> {
        Ok(Box::new(instance::WasmInstance::new(self.shared.clone())?))
    }
}
