//! ONNX Runtime through `ort` (`load-dynamic`): one environment per process, one session per
//! instance (`Session::run` takes `&mut self`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{RunOptions, Session};
use ort::value::{DynValue, Tensor as OrtTensor, TensorElementType, ValueType};
use wisp_core::config::params::{ExecutionMode, GraphLevel, OnnxOptions};
use wisp_core::{DataType, Error, Result, Tensor};

use crate::convert::{from_le, to_le};
use crate::ort_strings::{self, raw_strings};
use crate::Runner;
use wisp_core::tensor::{element_count, encode_bytes_elements};

/// The process-wide ONNX Runtime environment (ONNX Runtime allows exactly one).
static ENV: OnceLock<std::result::Result<(PathBuf, Environment), String>> = OnceLock::new();

pub(crate) struct OrtEngine {
    env: Environment,
}

impl OrtEngine {
    /// Loads the library at `lib` (once per process; later calls reuse it).
    pub(crate) fn init(lib: &Path) -> Result<Self> {
        let res = ENV.get_or_init(|| {
            let env = ort::init_from(lib)
                .map_err(|e| format!("cannot load ONNX Runtime from {}: {e}", lib.display()))?
                .with_name("wisp")
                .build()
                .map_err(|e| format!("cannot create the ONNX Runtime environment: {e}"))?;
            tracing::info!(lib = %lib.display(), "ONNX Runtime loaded");
            Ok((lib.to_path_buf(), env))
        });
        match res {
            Ok((_, env)) => Ok(OrtEngine { env: env.clone() }),
            Err(e) => Err(Error::unavailable(e.clone())),
        }
    }

    /// A model ONNX Runtime builds its sessions from: `bytes` (the file as read and checked
    /// once) when given, else the file at its path (a model with external data, which ONNX
    /// Runtime finds beside the file).
    pub(crate) fn prepare(
        &self,
        file: &Path,
        bytes: Option<std::sync::Arc<[u8]>>,
        intra: usize,
        inter: usize,
        options: &OnnxOptions,
    ) -> Result<OrtModel> {
        let model = OrtModel {
            env: self.env.clone(),
            file: file.to_path_buf(),
            bytes,
            intra,
            inter,
            options: options.clone(),
        };
        // Fail the load (not the first request) if the file does not open.
        drop(model.session()?);
        Ok(model)
    }
}

pub(crate) struct OrtModel {
    env: Environment,
    file: PathBuf,
    bytes: Option<std::sync::Arc<[u8]>>,
    intra: usize,
    inter: usize,
    /// The config's ONNX Runtime settings (Triton's keys).
    options: OnnxOptions,
}

impl OrtModel {
    pub(crate) fn session(&self) -> Result<OrtRunner> {
        let err = |e: &dyn std::fmt::Display| {
            Error::invalid(format!(
                "ONNX Runtime cannot load {}: {e}",
                self.file.display()
            ))
        };
        let mut builder = Session::builder(&self.env)
            .map_err(|e| err(&e))?
            .with_intra_threads(self.intra)
            .map_err(|e| err(&e))?
            .with_inter_threads(self.inter)
            .map_err(|e| err(&e))?;
        let o = &self.options;
        if let Some(mode) = o.execution_mode {
            builder = builder
                .with_parallel_execution(mode == ExecutionMode::Parallel)
                .map_err(|e| err(&e))?;
        }
        if let Some(on) = o.mem_pattern {
            builder = builder.with_memory_pattern(on).map_err(|e| err(&e))?;
        }
        if let Some(on) = o.mem_arena {
            builder = builder
                .with_execution_providers([ort::ep::CPU::default()
                    .with_arena_allocator(on)
                    .build()])
                .map_err(|e| err(&e))?;
        }
        if let Some(on) = o.device_allocator_for_initializers {
            builder = builder
                .with_config_entry(
                    "session.use_device_allocator_for_initializers",
                    if on { "1" } else { "0" },
                )
                .map_err(|e| err(&e))?;
        }
        builder = builder
            .with_optimization_level(match o.graph_level {
                GraphLevel::All => GraphOptimizationLevel::All,
                GraphLevel::Basic => GraphOptimizationLevel::Level1,
                GraphLevel::Extended => GraphOptimizationLevel::Level2,
                GraphLevel::Disabled => GraphOptimizationLevel::Disable,
            })
            .map_err(|e| err(&e))?;
        let session = match &self.bytes {
            Some(bytes) => builder.commit_from_memory(bytes),
            None => builder.commit_from_file(&self.file),
        }
        .map_err(|e| err(&e))?;
        let outputs = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        let run_options = match &o.arena_shrinkage {
            None => None,
            Some(arenas) => {
                let mut r = RunOptions::new().map_err(|e| err(&e))?;
                r.set("memory.enable_memory_arena_shrinkage", arenas)
                    .map_err(|e| err(&e))?;
                Some(r)
            }
        };
        Ok(OrtRunner {
            session,
            outputs,
            run_options,
        })
    }
}

pub(crate) struct OrtRunner {
    session: Session,
    outputs: Vec<String>,
    /// Per-run settings (`memory.enable_memory_arena_shrinkage`), when the config has any.
    run_options: Option<RunOptions>,
}

fn ort_err(e: ort::Error) -> Error {
    Error::internal(format!("ONNX Runtime: {e}"))
}

fn to_value(t: &Tensor) -> Result<DynValue> {
    let shape = t.shape.clone();
    macro_rules! make {
        ($ty:ty) => {
            OrtTensor::<$ty>::from_array((shape, from_le::<$ty>(&t.data)))
                .map(|v| v.into_dyn())
                .map_err(ort_err)
        };
    }
    match t.datatype {
        DataType::Bool => make!(bool),
        DataType::Uint8 => make!(u8),
        DataType::Uint16 => make!(u16),
        DataType::Uint32 => make!(u32),
        DataType::Uint64 => make!(u64),
        DataType::Int8 => make!(i8),
        DataType::Int16 => make!(i16),
        DataType::Int32 => make!(i32),
        DataType::Int64 => make!(i64),
        DataType::Fp16 => make!(half::f16),
        DataType::Fp32 => make!(f32),
        DataType::Fp64 => make!(f64),
        DataType::Bf16 => make!(half::bf16),
        DataType::Bytes => {
            let strings = raw_strings(&t.data)?;
            let mut v = OrtTensor::from_string_array((shape, strings.raw.as_slice()))
                .map(|v| v.into_dyn())
                .map_err(ort_err)?;
            strings.write_nul_elements(&mut v)?;
            Ok(v)
        }
    }
}

fn from_value(name: &str, v: &DynValue) -> Result<Tensor> {
    let ty = match v.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => {
            return Err(Error::unsupported(format!(
                "output '{name}' is a {other:?}, only tensors are served"
            )))
        }
    };
    macro_rules! take {
        ($ty:ty, $dt:expr) => {{
            let (shape, data) = v.try_extract_tensor::<$ty>().map_err(ort_err)?;
            ($dt, shape.to_vec(), to_le(data))
        }};
    }
    let (dt, shape, bytes) = match ty {
        TensorElementType::Bool => take!(bool, DataType::Bool),
        TensorElementType::Uint8 => take!(u8, DataType::Uint8),
        TensorElementType::Uint16 => take!(u16, DataType::Uint16),
        TensorElementType::Uint32 => take!(u32, DataType::Uint32),
        TensorElementType::Uint64 => take!(u64, DataType::Uint64),
        TensorElementType::Int8 => take!(i8, DataType::Int8),
        TensorElementType::Int16 => take!(i16, DataType::Int16),
        TensorElementType::Int32 => take!(i32, DataType::Int32),
        TensorElementType::Int64 => take!(i64, DataType::Int64),
        TensorElementType::Float16 => take!(half::f16, DataType::Fp16),
        TensorElementType::Float32 => take!(f32, DataType::Fp32),
        TensorElementType::Float64 => take!(f64, DataType::Fp64),
        TensorElementType::Bfloat16 => take!(half::bf16, DataType::Bf16),
        TensorElementType::String => {
            let shape = v.shape().to_vec();
            let count = element_count(&shape)
                .map_err(|e| Error::internal(format!("output '{name}': {}", e.message())))?;
            let elements = ort_strings::extract(v, count)?;
            (DataType::Bytes, shape, encode_bytes_elements(&elements))
        }
        other => {
            return Err(Error::unsupported(format!(
                "output '{name}' has element type {other:?}, which Wisp does not serve"
            )))
        }
    };
    Tensor::new(name, dt, shape, bytes.into())
}

impl Runner for OrtRunner {
    fn run(&mut self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let mut values: Vec<(String, DynValue)> = Vec::with_capacity(inputs.len());
        for t in &inputs {
            values.push((t.name.clone(), to_value(t)?));
        }
        let outputs = match &self.run_options {
            None => self.session.run(values),
            Some(r) => self.session.run_with_options(values, r),
        }
        .map_err(ort_err)?;
        self.outputs
            .iter()
            .map(|name| from_value(name, &outputs[name.as_str()]))
            .collect()
    }
}
