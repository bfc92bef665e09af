//! `wisp-backend-onnx`: serves ONNX models with ONNX Runtime or the embedded tract engine.
//!
//! ONNX Runtime is loaded at run time (`ort` with `load-dynamic`) from `--onnxruntime-lib`,
//! `ORT_DYLIB_PATH`, or an installed `onnxruntime` Python package (its `capi/` folder ships
//! `libonnxruntime.so*`). When none is found, the pure-Rust `tract` engine serves the model; tract
//! needs concrete shapes, so it builds one optimized plan per concrete input-shape set (in
//! practice, per batch size) and caches it for all instances.
//!
//! Without the `onnxruntime` feature (on by default; the edge build leaves it out) the crate
//! does not link `ort` at all: tract is the only engine, and asking for ONNX Runtime is an error.
//!
//! A request reaches [`OnnxInstance::execute`] as a batch of validated requests: their inputs are
//! concatenated along the batch dim, reshaped per the config, run, and split back per request.

mod convert;
mod discover;
mod known_wrong;
#[cfg_attr(not(feature = "onnxruntime"), path = "ort_disabled.rs")]
mod ort_engine;
#[cfg(feature = "onnxruntime")]
mod ort_strings;
mod tract_engine;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wisp_core::backend::{Backend, ExecTiming, Instance, LoadedModel};
use wisp_core::config::params::{EngineRequest, OnnxOptions, ENGINE_KEY};
use wisp_core::config::{IoSpec, ModelIo, ModelSpec, Signature};
use wisp_core::tensor::{concat_batch, element_count, split_batch};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

pub use discover::{find_onnxruntime, EnvSource, ProcessEnv};

/// Which engine runs ONNX models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    /// ONNX Runtime when its library is found, otherwise tract.
    Auto,
    /// ONNX Runtime only (loading fails if the library is missing).
    OnnxRuntime,
    /// tract only.
    Tract,
}

/// The ONNX backend, bound to one engine for the life of the process.
pub struct OnnxBackend {
    ort: Option<ort_engine::OrtEngine>,
    default_threads: usize,
}

impl OnnxBackend {
    /// Picks the engine: `choice` plus the library path found by [`find_onnxruntime`].
    pub fn new(choice: EngineChoice, ort_lib: Option<PathBuf>) -> Result<Self> {
        let ort = match (choice, ort_lib) {
            (EngineChoice::Tract, _) => None,
            (EngineChoice::OnnxRuntime, _) if !Self::HAS_ONNXRUNTIME => {
                return Err(Error::invalid(
                    "--onnx-engine onnxruntime: this wisp was built without ONNX Runtime (an edge build, tract only)",
                ))
            }
            (EngineChoice::OnnxRuntime, None) => {
                return Err(Error::invalid(
                    "--onnx-engine onnxruntime: no ONNX Runtime library found (pass --onnxruntime-lib, set ORT_DYLIB_PATH, or `pip install onnxruntime`)",
                ))
            }
            (EngineChoice::OnnxRuntime, Some(lib)) => Some(ort_engine::OrtEngine::init(&lib)?),
            (EngineChoice::Auto, None) => None,
            (EngineChoice::Auto, Some(lib)) => match ort_engine::OrtEngine::init(&lib) {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::warn!(lib = %lib.display(), error = %e, "ONNX Runtime failed to load; using tract");
                    None
                }
            },
        };
        let default_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(OnnxBackend {
            ort,
            default_threads,
        })
    }

    /// Whether this build can run ONNX Runtime at all (the `onnxruntime` feature).
    pub const HAS_ONNXRUNTIME: bool = cfg!(feature = "onnxruntime");

    /// Name of the engine models will run on.
    pub fn engine(&self) -> &'static str {
        if self.ort.is_some() {
            "onnxruntime"
        } else {
            "tract"
        }
    }
}

impl Backend for OnnxBackend {
    fn describe(&self, model_file: &Path) -> Result<ModelIo> {
        tract_engine::describe(model_file)
    }

    fn load(&self, model: &ModelSpec, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        let config = &*model.config;
        // Read once (a bounded regular file, never a mapping): its inputs and outputs, the
        // check against what the engine is known to get wrong, and tract's model all come from
        // these bytes.
        let (bytes, proto) = tract_engine::read_model(model_file, model.file_sha256.as_ref())?;
        let io = tract_engine::model_io(model_file, &proto)?;
        let spec = Arc::new(Spec::new(&model.signature, &io)?);
        let instances = config.instance_count().max(1);
        let options = &model.params.onnx;
        if let Some(a) = options.cpu_accelerators.first() {
            // Not run on the CPU provider instead: a model asked to run elsewhere does not
            // quietly run here at another speed.
            return Err(Error::invalid(format!(
                "optimization.execution_accelerators.cpu_execution_accelerator '{}': this wisp \
                 cannot run ONNX Runtime's OpenVINO provider; remove the accelerator to run the \
                 model on the CPU",
                a.name
            )));
        }
        if !options.gpu_only.is_empty() {
            tracing::warn!(
                model = %config.name,
                "GPU-only settings have no effect on this CPU host: {}",
                options.gpu_only.join(", ")
            );
        }
        let intra = options
            .intra_op
            .unwrap_or((self.default_threads / instances).max(1));
        let inter = options.inter_op.unwrap_or(1);
        // The model's own choice (`onnx.engine`) over the server's.
        let ort = match options.engine {
            None => self.ort.as_ref(),
            Some(EngineRequest::Tract) => None,
            Some(EngineRequest::OnnxRuntime) => Some(self.ort.as_ref().ok_or_else(|| {
                Error::invalid(format!(
                    "parameters.{ENGINE_KEY} 'onnxruntime': this server runs ONNX models on tract \
                     only ({}); remove the parameter or serve with ONNX Runtime",
                    if Self::HAS_ONNXRUNTIME {
                        "--onnx-engine tract, or no ONNX Runtime library was found"
                    } else {
                        "an edge build without ONNX Runtime"
                    }
                ))
            })?),
        };
        let engine: Engine = match ort {
            Some(ort) => {
                known_wrong::refuse_known_wrong(&proto, known_wrong::KnownWrong::OnnxRuntime)?;
                // Sessions are built from the bytes checked here, not from the path again.
                let bytes = (!tract_engine::has_external_data(&proto)).then(|| bytes.into());
                drop(proto);
                Engine::Ort(ort.prepare(model_file, bytes, intra, inter, options)?)
            }
            None => {
                let ort_settings = OnnxOptions {
                    engine: None,
                    ..options.clone()
                };
                if ort_settings != OnnxOptions::default() {
                    tracing::info!(
                        model = %config.name,
                        "tract runs this model: its ONNX Runtime settings do not apply"
                    );
                }
                drop(bytes);
                Engine::Tract(Arc::new(tract_engine::TractModel::load(
                    model_file, proto, &io, &spec,
                )?))
            }
        };
        Ok(Box::new(OnnxModel { spec, engine }))
    }
}

/// What an instance needs to know about the model's tensors.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) model: String,
    pub(crate) batches: bool,
    /// Config inputs (name, dtype, reshape target without batch dim).
    pub(crate) inputs: Vec<(String, DataType, Option<Vec<i64>>)>,
    /// Shape each model-file input (graph order) has at batch size 1, when fully known.
    pub(crate) batch1_shapes: Option<Vec<Vec<i64>>>,
    /// Model-file outputs in graph order, with the config's dims reshape (if any).
    pub(crate) outputs: Vec<(String, Option<Vec<i64>>)>,
    /// Model-file inputs in graph order.
    pub(crate) file_inputs: Vec<IoSpec>,
}

impl Spec {
    fn new(sig: &Signature, io: &ModelIo) -> Result<Self> {
        let mut inputs = Vec::new();
        for i in &sig.inputs {
            let dt = i.datatype;
            let Some(file) = io.inputs.iter().find(|t| t.name == i.name) else {
                return Err(Error::invalid(format!(
                    "model '{}': config input '{}' is not an input of the ONNX model (it has: {})",
                    sig.model,
                    i.name,
                    names(&io.inputs)
                )));
            };
            if file.datatype != Some(dt) {
                return Err(Error::invalid(format!(
                    "model '{}': input '{}' is {} in the config but {} in the ONNX model",
                    sig.model,
                    i.name,
                    dt.config_name(),
                    file.datatype
                        .map_or("an unsupported type", |d| d.config_name())
                )));
            }
            inputs.push((i.name.clone(), dt, i.reshape.clone()));
        }
        for o in &sig.outputs {
            let Some(file) = io.outputs.iter().find(|t| t.name == o.name) else {
                return Err(Error::invalid(format!(
                    "model '{}': config output '{}' is not an output of the ONNX model (it has: {})",
                    sig.model,
                    o.name,
                    names(&io.outputs)
                )));
            };
            let dt = o.datatype;
            if file.datatype != Some(dt) {
                return Err(Error::invalid(format!(
                    "model '{}': output '{}' is {} in the config but {} in the ONNX model",
                    sig.model,
                    o.name,
                    dt.config_name(),
                    file.datatype
                        .map_or("an unsupported type", |d| d.config_name())
                )));
            }
        }
        for i in &io.inputs {
            if sig.input(&i.name).is_none() {
                return Err(Error::invalid(format!(
                    "model '{}': ONNX input '{}' is missing from the config",
                    sig.model, i.name
                )));
            }
        }
        let outputs = io
            .outputs
            .iter()
            .map(|o| {
                let dims = sig
                    .output(&o.name)
                    .filter(|c| c.reshape.is_some())
                    .map(|c| c.dims.clone());
                (o.name.clone(), dims)
            })
            .collect();
        let batch1_shapes = io
            .inputs
            .iter()
            .map(|f| {
                let c = sig.input(&f.name)?;
                let mut shape: Vec<i64> = if sig.batches() { vec![1] } else { vec![] };
                shape.extend(c.reshape.as_ref().unwrap_or(&c.dims));
                shape.iter().all(|&d| d >= 0).then_some(shape)
            })
            .collect();
        Ok(Spec {
            batch1_shapes,
            model: sig.model.clone(),
            batches: sig.batches(),
            inputs,
            outputs,
            file_inputs: io.inputs.clone(),
        })
    }
}

fn names(v: &[IoSpec]) -> String {
    v.iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

enum Engine {
    Ort(ort_engine::OrtModel),
    Tract(Arc<tract_engine::TractModel>),
}

struct OnnxModel {
    spec: Arc<Spec>,
    engine: Engine,
}

impl LoadedModel for OnnxModel {
    fn engine(&self) -> &str {
        match self.engine {
            Engine::Ort(_) => "onnxruntime",
            Engine::Tract(_) => "tract",
        }
    }

    fn new_instance(&self, _index: usize) -> Result<Box<dyn Instance>> {
        let runner: Box<dyn Runner> = match &self.engine {
            Engine::Ort(m) => Box::new(m.session()?),
            Engine::Tract(m) => Box::new(tract_engine::TractRunner::new(m.clone())),
        };
        Ok(Box::new(OnnxInstance {
            spec: self.spec.clone(),
            runner,
        }))
    }
}

/// An engine session: runs full-shape tensors in, returns the model's outputs in graph order.
pub(crate) trait Runner: Send {
    fn run(&mut self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>>;
}

/// One ONNX model instance (its own session for ONNX Runtime; shared plans for tract).
pub struct OnnxInstance {
    spec: Arc<Spec>,
    runner: Box<dyn Runner>,
}

impl OnnxInstance {
    fn run_one(
        &mut self,
        inputs: Vec<Tensor>,
        rows: usize,
        timing: &mut ExecTiming,
    ) -> Result<Vec<Tensor>> {
        let start = std::time::Instant::now();
        let batch_prefix = |shape: &[i64]| -> Vec<i64> {
            if self.spec.batches {
                shape.first().copied().into_iter().collect()
            } else {
                Vec::new()
            }
        };
        let mut ordered = Vec::with_capacity(inputs.len());
        for t in inputs {
            let Some((_, _, reshape)) = self.spec.inputs.iter().find(|(n, _, _)| *n == t.name)
            else {
                continue;
            };
            match reshape {
                Some(target) => {
                    let mut shape = batch_prefix(&t.shape);
                    shape.extend(resolve(target, &t, shape.iter().product::<i64>().max(1))?);
                    ordered.push(Tensor { shape, ..t });
                }
                None => ordered.push(t),
            }
        }
        let ran = std::time::Instant::now();
        timing.input_ns += (ran - start).as_nanos() as u64;
        let mut outputs = self.runner.run(ordered)?;
        timing.infer_ns += ran.elapsed().as_nanos() as u64;
        for (out, (_, dims)) in outputs.iter_mut().zip(self.spec.outputs.iter()) {
            if let Some(dims) = dims {
                let mut shape: Vec<i64> = if self.spec.batches {
                    vec![rows as i64]
                } else {
                    Vec::new()
                };
                let prefix = shape.iter().product::<i64>().max(1);
                shape.extend(resolve(dims, out, prefix)?);
                out.shape = shape;
            }
        }
        Ok(outputs)
    }
}

/// `target` with a -1 resolved so the element count matches `t`'s (less `prefix` rows).
fn resolve(target: &[i64], t: &Tensor, prefix: i64) -> Result<Vec<i64>> {
    let total = t.element_count() as i64;
    let known: i64 = target.iter().filter(|&&d| d >= 0).product();
    let mut out = target.to_vec();
    if let Some(pos) = out.iter().position(|&d| d < 0) {
        out[pos] = if known * prefix == 0 {
            0
        } else {
            total / (known * prefix)
        };
    }
    let count = element_count(&out)? as i64 * prefix;
    if count != total {
        return Err(Error::invalid(format!(
            "tensor '{}': cannot reshape {:?} to {:?}",
            t.name, t.shape, target
        )));
    }
    Ok(out)
}

impl Instance for OnnxInstance {
    /// A session run needs no thread placement and calls no other model.
    fn runs_on_caller(&self) -> bool {
        true
    }

    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let model = self.spec.model.clone();
        let fail = |e: Error, n: usize| -> Vec<Result<InferResponse>> {
            let e = e.context(format!("model '{model}'"));
            (0..n).map(|_| Err(e.clone())).collect()
        };
        if batch.len() == 1 || !self.spec.batches {
            return batch
                .iter()
                .map(|r| {
                    let rows = r.batch_size(self.spec.batches);
                    self.run_one(r.inputs.clone(), rows, timing)
                        .map(InferResponse::new)
                        .map_err(|e| e.context(format!("model '{model}'")))
                })
                .collect();
        }
        // Concatenate each input over the batch, run once, split back.
        let start = std::time::Instant::now();
        let sizes: Vec<usize> = batch.iter().map(|r| r.batch_size(true)).collect();
        let mut inputs = Vec::new();
        for (name, _, _) in &self.spec.inputs {
            let parts: Vec<&Tensor> = batch
                .iter()
                .filter_map(|r| r.inputs.iter().find(|t| &t.name == name))
                .collect();
            if parts.is_empty() {
                continue;
            }
            if parts.len() != batch.len() {
                return fail(
                    Error::invalid(format!(
                        "optional input '{name}' is present in only some requests of a batch"
                    )),
                    batch.len(),
                );
            }
            match concat_batch(&parts) {
                Ok(t) => inputs.push(t),
                Err(e) => return fail(e, batch.len()),
            }
        }
        timing.input_ns += start.elapsed().as_nanos() as u64;
        let outputs = match self.run_one(inputs, sizes.iter().sum(), timing) {
            Ok(o) => o,
            Err(e) => return fail(e, batch.len()),
        };
        let split = std::time::Instant::now();
        let mut per_request: Vec<InferResponse> = vec![InferResponse::default(); batch.len()];
        for out in &outputs {
            match split_batch(out, &sizes) {
                Ok(parts) => {
                    for (resp, part) in per_request.iter_mut().zip(parts) {
                        resp.outputs.push(part);
                    }
                }
                Err(e) => return fail(e, batch.len()),
            }
        }
        timing.output_ns += split.elapsed().as_nanos() as u64;
        per_request.into_iter().map(Ok).collect()
    }
}
