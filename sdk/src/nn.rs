//! Calling the server's other models through `wasi:nn` (Triton's "business logic scripting").
//!
//! ```no_run
//! # use wisp_sdk::{nn, Tensor, Error};
//! # fn f() -> Result<(), Error> {
//! let classifier = nn::Model::load("ppocr_cls")?; // or "ppocr_cls:1" for a version
//! let out = classifier.infer(&[Tensor::from_f32("x", vec![1, 3, 48, 192], &vec![0.0; 3 * 48 * 192])])?;
//! # Ok(()) }
//! ```
//!
//! A call goes through the model's own scheduler, so it batches with the server's other
//! traffic, and it waits at most until this plugin's deadline. wasi-nn carries only FP16, FP32,
//! FP64, BF16, UINT8, INT32 and INT64 tensors. Outside the server (native unit tests)
//! [`Model::load`] returns an `unsupported` error.

use crate::{Datatype, Error, Tensor};

#[cfg(target_family = "wasm")]
use crate::bindings::wasi::nn::{errors, graph, inference, tensor};

/// A model served by the host.
pub struct Model {
    name: String,
    #[cfg(target_family = "wasm")]
    context: inference::GraphExecutionContext,
}

#[cfg(target_family = "wasm")]
fn nn_error(what: &str, e: errors::Error) -> Error {
    let message = format!("{what}: {}", e.data());
    match e.code() {
        errors::ErrorCode::InvalidArgument | errors::ErrorCode::InvalidEncoding => {
            Error::invalid(message)
        }
        errors::ErrorCode::NotFound => Error::not_found(message),
        errors::ErrorCode::UnsupportedOperation => Error::unsupported(message),
        errors::ErrorCode::Timeout => Error::unavailable(message),
        _ => Error::internal(message),
    }
}

#[cfg(target_family = "wasm")]
fn to_nn(d: Datatype) -> Option<tensor::TensorType> {
    use tensor::TensorType as T;
    Some(match d {
        Datatype::Fp16 => T::Fp16,
        Datatype::Fp32 => T::Fp32,
        Datatype::Fp64 => T::Fp64,
        Datatype::Bf16 => T::Bf16,
        Datatype::Uint8 => T::U8,
        Datatype::Int32 => T::I32,
        Datatype::Int64 => T::I64,
        _ => return None,
    })
}

#[cfg(target_family = "wasm")]
fn from_nn(t: tensor::TensorType) -> Datatype {
    use tensor::TensorType as T;
    match t {
        T::Fp16 => Datatype::Fp16,
        T::Fp32 => Datatype::Fp32,
        T::Fp64 => Datatype::Fp64,
        T::Bf16 => Datatype::Bf16,
        T::U8 => Datatype::Uint8,
        T::I32 => Datatype::Int32,
        T::I64 => Datatype::Int64,
    }
}

impl Model {
    /// Resolves `"model"` or `"model:version"` on the host.
    pub fn load(name: &str) -> Result<Model, Error> {
        #[cfg(target_family = "wasm")]
        {
            let g = graph::load_by_name(name).map_err(|e| nn_error(name, e))?;
            let context = g.init_execution_context().map_err(|e| nn_error(name, e))?;
            Ok(Model {
                name: name.to_string(),
                context,
            })
        }
        #[cfg(not(target_family = "wasm"))]
        {
            Err(Error::unsupported(format!(
                "cannot load '{name}': wasi-nn is only available inside the wisp server"
            )))
        }
    }

    /// The name it was loaded by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the model on `inputs` (full shapes, batch dimension included when the model
    /// batches) and returns all its outputs.
    pub fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        for t in inputs {
            if !matches!(
                t.datatype,
                Datatype::Fp16
                    | Datatype::Fp32
                    | Datatype::Fp64
                    | Datatype::Bf16
                    | Datatype::Uint8
                    | Datatype::Int32
                    | Datatype::Int64
            ) {
                return Err(Error::unsupported(format!(
                    "input '{}' is {}, which wasi-nn cannot carry",
                    t.name,
                    t.datatype.as_str()
                )));
            }
            if t.shape.iter().any(|&d| d < 0 || d > i64::from(u32::MAX)) {
                return Err(Error::invalid(format!(
                    "input '{}' has shape {:?}, which wasi-nn cannot carry",
                    t.name, t.shape
                )));
            }
        }
        #[cfg(target_family = "wasm")]
        {
            let named: Vec<(String, tensor::Tensor)> = inputs
                .iter()
                .map(|t| {
                    let dims: Vec<u32> = t.shape.iter().map(|&d| d as u32).collect();
                    let ty = to_nn(t.datatype).expect("checked above");
                    (t.name.clone(), tensor::Tensor::new(&dims, ty, &t.data))
                })
                .collect();
            let outputs = self
                .context
                .compute(named)
                .map_err(|e| nn_error(&self.name, e))?;
            Ok(outputs
                .into_iter()
                .map(|(name, t)| Tensor {
                    name,
                    datatype: from_nn(t.ty()),
                    shape: t.dimensions().iter().map(|&d| i64::from(d)).collect(),
                    data: t.data(),
                })
                .collect())
        }
        #[cfg(not(target_family = "wasm"))]
        {
            Err(Error::unsupported(
                "wasi-nn is only available inside the wisp server",
            ))
        }
    }
}
