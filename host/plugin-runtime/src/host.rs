//! Host side of the `wisp:plugin` world: generated bindings, the per-store state, logging, and
//! conversions between the WIT types and `wisp-core`'s.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wisp_core::{DataType, Error, ErrorKind, InferRequest, Tensor};

use crate::ModelCaller;

/// Bindings of `wisp:plugin@0.1.0`, for linking what its components import (the 0.1.0
/// `logging` interface and `wasi:nn`). Its exports are called with the 0.2.0 types, which are
/// structurally the same: component types match by structure, not by package version.
pub mod v1 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "wisp:plugin/model@0.1.0",
        imports: { default: trappable },
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "wasi:nn/tensor.tensor": crate::nn::NnTensor,
            "wasi:nn/graph.graph": crate::nn::NnGraph,
            "wasi:nn/inference.graph-execution-context": crate::nn::NnContext,
            "wasi:nn/errors.error": crate::nn::NnError,
        },
    });
}

/// Bindings of `wisp:plugin@0.2.0`, for linking what its components import (its `logging` and
/// `models`, served by the 0.3.0 implementations through [`crate::compat`]). Its exports are
/// called with the 0.3.0 types, which are structurally the same.
pub mod v2 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "wisp:plugin/model@0.2.0",
        imports: { default: trappable },
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "wasi:nn": super::v1::wasi::nn,
        },
    });
}

/// Bindings of `wisp:plugin@0.3.0`, the current world: `models`, `responses` and `describe`.
pub mod v3 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "wisp:plugin/model@0.3.0",
        imports: { default: trappable },
        // A guest export's parameters borrow: a request's tensors are lowered into the guest
        // straight from the host's buffers, the one copy a call makes.
        ownership: Borrowing { duplicate_if_necessary: true },
        with: {
            "wasi:nn": super::v1::wasi::nn,
        },
    });
}

pub use v3::wisp::plugin0_3_0::types as wit;
pub use v3::{Model, ModelPre};

/// Where the responses to one request of the batch being executed go (decoupled models).
#[derive(Debug, Default)]
pub(crate) struct Stream {
    /// The client's stream, when a streaming front end made the request.
    pub sink: Option<Arc<dyn wisp_core::infer::ResponseSink>>,
    /// The request's batch size (what every output's first dimension must be).
    pub rows: i64,
    /// Its final response was sent.
    pub finished: bool,
}

/// What one plugin instance's store holds.
pub struct State {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: crate::limits::Limiter,
    /// The model this plugin serves (a plugin may not call itself through wasi-nn).
    pub(crate) model: Arc<str>,
    /// Runs wasi-nn calls on the server's models.
    pub(crate) caller: Option<Arc<dyn ModelCaller>>,
    /// When the current call must be over (wasi-nn calls wait at most until then).
    pub(crate) deadline: Instant,
    /// The trace of the batch being executed (its first traced request): its wasi-nn calls
    /// become child traces of it.
    pub(crate) trace: Option<std::sync::Arc<wisp_core::trace::Trace>>,
    /// The models the batch being executed was called from, then this one: a call to any of
    /// them is refused (it would wait on itself).
    pub(crate) call_path: Vec<Arc<str>>,
    /// The model's signature, which sent responses are checked against (`None` while
    /// `describe` runs).
    pub(crate) signature: Option<Arc<wisp_core::config::Signature>>,
    /// Whether the model is decoupled (may send responses through `responses`).
    pub(crate) decoupled: bool,
    /// One per request of the batch being executed (empty between calls).
    pub(crate) streams: Vec<Stream>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wit::Host for State {}

impl v2::wisp::plugin0_2_0::types::Host for State {}

impl v1::wisp::plugin0_1_0::types::Host for State {}

impl v1::wisp::plugin0_1_0::logging::Host for State {
    fn log(
        &mut self,
        level: v1::wisp::plugin0_1_0::logging::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        <Self as Logging>::log(self, level_v1(level), message)
    }

    fn enabled(&mut self, level: v1::wisp::plugin0_1_0::logging::Level) -> wasmtime::Result<bool> {
        <Self as Logging>::enabled(self, level_v1(level))
    }
}

impl v2::wisp::plugin0_2_0::logging::Host for State {
    fn log(
        &mut self,
        level: v2::wisp::plugin0_2_0::logging::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        <Self as Logging>::log(self, level_v2(level), message)
    }

    fn enabled(&mut self, level: v2::wisp::plugin0_2_0::logging::Level) -> wasmtime::Result<bool> {
        <Self as Logging>::enabled(self, level_v2(level))
    }
}

use v3::wisp::plugin0_3_0::logging::{Host as Logging, Level};

/// The same level in the current world's enum.
macro_rules! level_from {
    ($name:ident, $from:ty) => {
        fn $name(l: $from) -> Level {
            use $from as A;
            match l {
                A::Trace => Level::Trace,
                A::Debug => Level::Debug,
                A::Info => Level::Info,
                A::Warn => Level::Warn,
                A::Error => Level::Error,
            }
        }
    };
}
level_from!(level_v1, v1::wisp::plugin0_1_0::logging::Level);
level_from!(level_v2, v2::wisp::plugin0_2_0::logging::Level);

impl Logging for State {
    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        const MAX: usize = 4096;
        let mut message = message;
        if message.len() > MAX {
            let mut cut = MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        let model = &*self.model;
        match level {
            Level::Trace => tracing::trace!(target: "wisp::plugin", model, "{message}"),
            Level::Debug => tracing::debug!(target: "wisp::plugin", model, "{message}"),
            Level::Info => tracing::info!(target: "wisp::plugin", model, "{message}"),
            Level::Warn => tracing::warn!(target: "wisp::plugin", model, "{message}"),
            Level::Error => tracing::error!(target: "wisp::plugin", model, "{message}"),
        }
        Ok(())
    }

    fn enabled(&mut self, level: Level) -> wasmtime::Result<bool> {
        Ok(match level {
            Level::Trace => tracing::enabled!(target: "wisp::plugin", tracing::Level::TRACE),
            Level::Debug => tracing::enabled!(target: "wisp::plugin", tracing::Level::DEBUG),
            Level::Info => tracing::enabled!(target: "wisp::plugin", tracing::Level::INFO),
            Level::Warn => tracing::enabled!(target: "wisp::plugin", tracing::Level::WARN),
            Level::Error => tracing::enabled!(target: "wisp::plugin", tracing::Level::ERROR),
        })
    }
}

/// The WIT datatype of a core one.
pub fn to_wit_datatype(d: DataType) -> wit::Datatype {
    use wit::Datatype as W;
    match d {
        DataType::Bool => W::Bool,
        DataType::Uint8 => W::Uint8,
        DataType::Uint16 => W::Uint16,
        DataType::Uint32 => W::Uint32,
        DataType::Uint64 => W::Uint64,
        DataType::Int8 => W::Int8,
        DataType::Int16 => W::Int16,
        DataType::Int32 => W::Int32,
        DataType::Int64 => W::Int64,
        DataType::Fp16 => W::Fp16,
        DataType::Fp32 => W::Fp32,
        DataType::Fp64 => W::Fp64,
        DataType::Bf16 => W::Bf16,
        DataType::Bytes => W::Bytes,
    }
}

/// The core datatype of a WIT one.
pub fn from_wit_datatype(d: wit::Datatype) -> DataType {
    use wit::Datatype as W;
    match d {
        W::Bool => DataType::Bool,
        W::Uint8 => DataType::Uint8,
        W::Uint16 => DataType::Uint16,
        W::Uint32 => DataType::Uint32,
        W::Uint64 => DataType::Uint64,
        W::Int8 => DataType::Int8,
        W::Int16 => DataType::Int16,
        W::Int32 => DataType::Int32,
        W::Int64 => DataType::Int64,
        W::Fp16 => DataType::Fp16,
        W::Fp32 => DataType::Fp32,
        W::Fp64 => DataType::Fp64,
        W::Bf16 => DataType::Bf16,
        W::Bytes => DataType::Bytes,
    }
}

/// A parameter value as the plugin sees it; `text` holds the JSON text of a value that is not
/// a bool, number or string (null, an array or an object), which the borrowed WIT value points
/// into.
fn to_wit_param_value<'a>(v: &'a serde_json::Value, text: &'a str) -> wit::ParamValueParam<'a> {
    use serde_json::Value;
    match v {
        Value::Bool(b) => wit::ParamValueParam::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => wit::ParamValueParam::Int(i),
            None => wit::ParamValueParam::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => wit::ParamValueParam::Text(s),
        _ => wit::ParamValueParam::Text(text),
    }
}

/// What a borrowed WIT request of one [`InferRequest`] points into besides the request itself:
/// the lists of borrowed tensors, names and parameters, and the JSON text of non-scalar
/// parameters. Tensor data is not copied here; the call copies it into the guest, once.
pub struct WitParts<'a> {
    inputs: Vec<wit::TensorParam<'a>>,
    requested_outputs: Vec<&'a str>,
    texts: Vec<String>,
    request: &'a InferRequest,
}

impl<'a> WitParts<'a> {
    /// The parts of `r`.
    pub fn new(r: &'a InferRequest) -> Self {
        WitParts {
            inputs: r
                .inputs
                .iter()
                .map(|t| wit::TensorParam {
                    name: &t.name,
                    datatype: to_wit_datatype(t.datatype),
                    shape: &t.shape,
                    data: &t.data,
                })
                .collect(),
            requested_outputs: r.requested_outputs.iter().map(String::as_str).collect(),
            texts: r
                .parameters
                .values()
                .map(|v| match v {
                    serde_json::Value::Bool(_)
                    | serde_json::Value::Number(_)
                    | serde_json::Value::String(_) => String::new(),
                    // null, arrays and objects reach the plugin as their JSON text
                    _ => v.to_string(),
                })
                .collect(),
            request: r,
        }
    }

    /// The request's parameters, borrowed.
    pub fn parameters(&self) -> Vec<wit::ParamParam<'_>> {
        self.request
            .parameters
            .iter()
            .zip(&self.texts)
            .map(|((key, v), text)| wit::ParamParam {
                key,
                value: to_wit_param_value(v, text),
            })
            .collect()
    }

    /// The request as the plugin sees it, with `parameters` from [`WitParts::parameters`].
    pub fn request<'b>(&'b self, parameters: &'b [wit::ParamParam<'b>]) -> wit::RequestParam<'b> {
        wit::RequestParam {
            id: &self.request.id,
            inputs: &self.inputs,
            requested_outputs: &self.requested_outputs,
            parameters,
        }
    }
}

/// A plugin's output tensor as a core tensor (checks data length against shape and type).
pub fn from_wit_tensor(t: wit::TensorResult) -> wisp_core::Result<Tensor> {
    if let Some(d) = t.shape.iter().find(|&&d| d < 0) {
        return Err(Error::internal(format!(
            "output '{}' has a negative dimension {d} in shape {:?}",
            t.name, t.shape
        )));
    }
    Tensor::new(
        t.name,
        from_wit_datatype(t.datatype),
        t.shape,
        Bytes::from(t.data),
    )
    .map_err(|e| Error::internal(e.message().to_string()))
}

/// A plugin's error as a core error.
pub fn from_wit_error(e: wit::Error) -> Error {
    let kind = match e.code {
        wit::ErrorCode::InvalidArgument => ErrorKind::InvalidArg,
        wit::ErrorCode::NotFound => ErrorKind::NotFound,
        wit::ErrorCode::Unavailable => ErrorKind::Unavailable,
        wit::ErrorCode::Unsupported => ErrorKind::Unsupported,
        wit::ErrorCode::Internal => ErrorKind::Internal,
    };
    Error::new(kind, e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatypes_round_trip() {
        for name in [
            "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
            "FP16", "FP32", "FP64", "BF16", "BYTES",
        ] {
            let d = DataType::parse(name).unwrap();
            assert_eq!(from_wit_datatype(to_wit_datatype(d)), d);
        }
    }

    #[test]
    fn parameters_keep_their_types() {
        let mut r = InferRequest::default();
        r.parameters.insert("b".into(), true.into());
        r.parameters.insert("i".into(), (-3).into());
        r.parameters.insert("f".into(), 0.5.into());
        r.parameters.insert("s".into(), "x".into());
        r.parameters.insert("n".into(), serde_json::Value::Null);
        r.parameters.insert("a".into(), serde_json::json!([1, 2]));
        let parts = WitParts::new(&r);
        let parameters = parts.parameters();
        let w = parts.request(&parameters);
        let find = |k: &str| {
            w.parameters
                .iter()
                .find(|p| p.key == k)
                .unwrap()
                .value
                .clone()
        };
        assert!(matches!(find("b"), wit::ParamValueParam::Bool(true)));
        assert!(matches!(find("i"), wit::ParamValueParam::Int(-3)));
        assert!(matches!(find("f"), wit::ParamValueParam::Double(v) if v == 0.5));
        assert!(matches!(find("s"), wit::ParamValueParam::Text(s) if s == "x"));
        assert!(matches!(find("n"), wit::ParamValueParam::Text(s) if s == "null"));
        assert!(matches!(find("a"), wit::ParamValueParam::Text(s) if s == "[1,2]"));
    }

    #[test]
    fn output_tensors_are_checked() {
        let bad = wit::TensorResult {
            name: "y".into(),
            datatype: wit::Datatype::Fp32,
            shape: vec![2],
            data: vec![0; 4],
        };
        let e = from_wit_tensor(bad).unwrap_err();
        assert!(e.message().contains("'y'"), "{}", e.message());
    }
}
