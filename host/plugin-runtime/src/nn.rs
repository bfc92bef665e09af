//! `wasi:nn@0.2.0-rc-2024-10-28` for plugins, backed by the server's own models.
//!
//! `load-by-name("model")` or `load-by-name("model:version")` resolves a model this server
//! serves; `compute` sends one request through that model's scheduler (so it batches with
//! external traffic and counts in that model's statistics) and waits at most until the calling
//! plugin's deadline. Loading graph bytes (`load`) is not supported: models live in the
//! repository.

use std::time::Instant;

use bytes::Bytes;
use wasmtime::component::Resource;
use wisp_core::{DataType, ErrorKind, InferRequest, Tensor};

use crate::host::v1::wasi::nn::{errors, graph, inference, tensor};
use crate::host::State;

/// A tensor handed between a plugin and wasi-nn.
pub struct NnTensor {
    dims: Vec<u32>,
    ty: tensor::TensorType,
    data: Vec<u8>,
}

/// A served model, resolved by name.
pub struct NnGraph {
    model: String,
    version: Option<String>,
}

/// An execution context on a served model.
pub struct NnContext {
    model: String,
    version: Option<String>,
}

/// A wasi-nn error: a code and a message.
pub struct NnError {
    code: errors::ErrorCode,
    message: String,
}

type NnResult<T> = wasmtime::Result<Result<T, Resource<NnError>>>;

impl State {
    fn nn_error<T>(&mut self, code: errors::ErrorCode, message: impl Into<String>) -> NnResult<T> {
        let e = self.table.push(NnError {
            code,
            message: message.into(),
        })?;
        Ok(Err(e))
    }
}

fn code_for(kind: ErrorKind) -> errors::ErrorCode {
    match kind {
        ErrorKind::InvalidArg => errors::ErrorCode::InvalidArgument,
        ErrorKind::NotFound => errors::ErrorCode::NotFound,
        ErrorKind::Unsupported => errors::ErrorCode::UnsupportedOperation,
        ErrorKind::Unavailable
        | ErrorKind::AlreadyExists
        | ErrorKind::Internal
        | ErrorKind::TooLarge
        | ErrorKind::Exhausted
        | ErrorKind::Forbidden => errors::ErrorCode::RuntimeError,
    }
}

fn to_datatype(t: tensor::TensorType) -> DataType {
    use tensor::TensorType as T;
    match t {
        T::Fp16 => DataType::Fp16,
        T::Fp32 => DataType::Fp32,
        T::Fp64 => DataType::Fp64,
        T::Bf16 => DataType::Bf16,
        T::U8 => DataType::Uint8,
        T::I32 => DataType::Int32,
        T::I64 => DataType::Int64,
    }
}

fn from_datatype(d: DataType) -> Option<tensor::TensorType> {
    use tensor::TensorType as T;
    Some(match d {
        DataType::Fp16 => T::Fp16,
        DataType::Fp32 => T::Fp32,
        DataType::Fp64 => T::Fp64,
        DataType::Bf16 => T::Bf16,
        DataType::Uint8 => T::U8,
        DataType::Int32 => T::I32,
        DataType::Int64 => T::I64,
        _ => return None,
    })
}

/// `"model"` or `"model:version"`.
fn parse_name(name: &str) -> Option<(String, Option<String>)> {
    let (model, version) = match name.rsplit_once(':') {
        Some((m, v)) => (m, Some(v)),
        None => (name, None),
    };
    if model.is_empty() || version.is_some_and(|v| v.is_empty() || v.parse::<u64>().is_err()) {
        return None;
    }
    Some((model.to_string(), version.map(str::to_string)))
}

impl tensor::Host for State {}

impl tensor::HostTensor for State {
    fn new(
        &mut self,
        dimensions: Vec<u32>,
        ty: tensor::TensorType,
        data: Vec<u8>,
    ) -> wasmtime::Result<Resource<NnTensor>> {
        Ok(self.table.push(NnTensor {
            dims: dimensions,
            ty,
            data,
        })?)
    }

    fn dimensions(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<Vec<u32>> {
        Ok(self.table.get(&t)?.dims.clone())
    }

    fn ty(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<tensor::TensorType> {
        Ok(self.table.get(&t)?.ty)
    }

    fn data(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&t)?.data.clone())
    }

    fn drop(&mut self, t: Resource<NnTensor>) -> wasmtime::Result<()> {
        self.table.delete(t)?;
        Ok(())
    }
}

impl graph::Host for State {
    fn load(
        &mut self,
        _builder: Vec<Vec<u8>>,
        _encoding: graph::GraphEncoding,
        _target: graph::ExecutionTarget,
    ) -> NnResult<Resource<NnGraph>> {
        self.nn_error(
            errors::ErrorCode::UnsupportedOperation,
            "wisp serves models from its repository: use load-by-name(\"<model>\") or load-by-name(\"<model>:<version>\")",
        )
    }

    fn load_by_name(&mut self, name: String) -> NnResult<Resource<NnGraph>> {
        let Some((model, version)) = parse_name(&name) else {
            return self.nn_error(
                errors::ErrorCode::InvalidArgument,
                format!("'{name}' is not \"<model>\" or \"<model>:<version>\""),
            );
        };
        if model == *self.model {
            return self.nn_error(
                errors::ErrorCode::InvalidArgument,
                format!("plugin '{model}' cannot call its own model"),
            );
        }
        let Some(caller) = self.caller.clone() else {
            return self.nn_error(
                errors::ErrorCode::UnsupportedOperation,
                "this host serves no models to plugins",
            );
        };
        if let Err(e) = caller.check(&model, version.as_deref()) {
            return self.nn_error(code_for(e.kind()), e.message());
        }
        Ok(Ok(self.table.push(NnGraph { model, version })?))
    }
}

impl graph::HostGraph for State {
    fn init_execution_context(
        &mut self,
        g: Resource<NnGraph>,
    ) -> NnResult<Resource<inference::GraphExecutionContext>> {
        let g = self.table.get(&g)?;
        let ctx = NnContext {
            model: g.model.clone(),
            version: g.version.clone(),
        };
        Ok(Ok(self.table.push(ctx)?))
    }

    fn drop(&mut self, g: Resource<NnGraph>) -> wasmtime::Result<()> {
        self.table.delete(g)?;
        Ok(())
    }
}

impl inference::Host for State {}

impl inference::HostGraphExecutionContext for State {
    fn compute(
        &mut self,
        ctx: Resource<NnContext>,
        inputs: Vec<(String, Resource<NnTensor>)>,
    ) -> NnResult<Vec<(String, Resource<NnTensor>)>> {
        let (model, version) = {
            let c = self.table.get(&ctx)?;
            (c.model.clone(), c.version.clone())
        };
        let mut request = InferRequest::default();
        for (name, t) in inputs {
            let t = self.table.delete(t)?;
            let shape = t.dims.iter().map(|&d| i64::from(d)).collect();
            match Tensor::new(&name, to_datatype(t.ty), shape, Bytes::from(t.data)) {
                Ok(t) => request.inputs.push(t),
                Err(e) => return self.nn_error(errors::ErrorCode::InvalidArgument, e.message()),
            }
        }
        let Some(caller) = self.caller.clone() else {
            return self.nn_error(
                errors::ErrorCode::UnsupportedOperation,
                "this host serves no models to plugins",
            );
        };
        if Instant::now() >= self.deadline {
            return self.nn_error(
                errors::ErrorCode::Timeout,
                "the plugin's deadline passed before compute",
            );
        }
        if self.call_path.iter().any(|m| **m == *model) {
            return self.nn_error(
                errors::ErrorCode::InvalidArgument,
                format!("model '{model}' is already on this call's path: a plugin cannot call a model that called it"),
            );
        }
        // the caller makes it a child trace of the request being served
        request.trace = self.trace.clone();
        request.call_path = self.call_path.clone();
        let response = match caller.infer(&model, version.as_deref(), request, self.deadline) {
            Ok(r) => r,
            Err(e) => {
                let code = if Instant::now() >= self.deadline {
                    errors::ErrorCode::Timeout
                } else {
                    code_for(e.kind())
                };
                return self.nn_error(code, format!("model '{model}': {}", e.message()));
            }
        };
        let mut outputs = Vec::with_capacity(response.outputs.len());
        for t in response.outputs {
            let Some(ty) = from_datatype(t.datatype) else {
                return self.nn_error(
                    errors::ErrorCode::UnsupportedOperation,
                    format!(
                        "model '{model}' output '{}' is {}, which wasi-nn cannot represent",
                        t.name, t.datatype
                    ),
                );
            };
            let dims = t.shape.iter().map(|&d| d as u32).collect();
            let handle = self.table.push(NnTensor {
                dims,
                ty,
                data: t.data.to_vec(),
            })?;
            outputs.push((t.name, handle));
        }
        Ok(Ok(outputs))
    }

    fn drop(&mut self, ctx: Resource<NnContext>) -> wasmtime::Result<()> {
        self.table.delete(ctx)?;
        Ok(())
    }
}

impl errors::Host for State {}

impl errors::HostError for State {
    fn code(&mut self, e: Resource<NnError>) -> wasmtime::Result<errors::ErrorCode> {
        Ok(self.table.get(&e)?.code)
    }

    fn data(&mut self, e: Resource<NnError>) -> wasmtime::Result<String> {
        Ok(self.table.get(&e)?.message.clone())
    }

    fn drop(&mut self, e: Resource<NnError>) -> wasmtime::Result<()> {
        self.table.delete(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_and_without_versions() {
        assert_eq!(parse_name("m"), Some(("m".into(), None)));
        assert_eq!(parse_name("m:3"), Some(("m".into(), Some("3".into()))));
        assert_eq!(parse_name(""), None);
        assert_eq!(parse_name("m:"), None);
        assert_eq!(parse_name("m:x"), None);
    }

    #[test]
    fn wasi_nn_types_map_both_ways() {
        use tensor::TensorType as T;
        for t in [T::Fp16, T::Fp32, T::Fp64, T::Bf16, T::U8, T::I32, T::I64] {
            assert_eq!(from_datatype(to_datatype(t)), Some(t));
        }
        assert_eq!(from_datatype(DataType::Bytes), None);
    }
}
