//! `wisp:plugin@0.2.0` components on the 0.3.0 host: their `models` import is served by the
//! 0.3.0 implementation, its values converted field by field (the two packages' types are the
//! same in structure, but bindgen makes them distinct Rust types).

use crate::host::{v2, wit, State};
use crate::models::Called;

use v2::wisp::plugin0_2_0::types as old;

/// The same enum case in the other package's type.
macro_rules! same_cases {
    ($name:ident, $from:ty => $to:ty, $($case:ident),+) => {
        fn $name(v: $from) -> $to {
            match v {
                $(<$from>::$case => <$to>::$case,)+
            }
        }
    };
}

same_cases!(datatype, old::Datatype => wit::Datatype,
    Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Fp16, Fp32, Fp64, Bf16, Bytes);
same_cases!(datatype_back, wit::Datatype => old::Datatype,
    Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Fp16, Fp32, Fp64, Bf16, Bytes);
same_cases!(code_back, wit::ErrorCode => old::ErrorCode,
    InvalidArgument, NotFound, Unavailable, Unsupported, Internal);

fn request(r: old::RequestResult) -> wit::RequestResult {
    wit::RequestResult {
        id: r.id,
        inputs: r
            .inputs
            .into_iter()
            .map(|t| wit::TensorResult {
                name: t.name,
                datatype: datatype(t.datatype),
                shape: t.shape,
                data: t.data,
            })
            .collect(),
        requested_outputs: r.requested_outputs,
        parameters: r
            .parameters
            .into_iter()
            .map(|p| wit::ParamResult {
                key: p.key,
                value: match p.value {
                    old::ParamValueResult::Bool(b) => wit::ParamValueResult::Bool(b),
                    old::ParamValueResult::Int(i) => wit::ParamValueResult::Int(i),
                    old::ParamValueResult::Double(d) => wit::ParamValueResult::Double(d),
                    old::ParamValueResult::Text(t) => wit::ParamValueResult::Text(t),
                },
            })
            .collect(),
    }
}

fn error_back(e: wit::Error) -> old::Error {
    old::Error {
        code: code_back(e.code),
        message: e.message,
    }
}

fn response_back(r: wit::Response) -> old::Response {
    old::Response {
        outputs: r
            .outputs
            .into_iter()
            .map(|t| old::TensorResult {
                name: t.name,
                datatype: datatype_back(t.datatype),
                shape: t.shape,
                data: t.data,
            })
            .collect(),
    }
}

type OldCalled =
    std::result::Result<Vec<std::result::Result<old::Response, old::Error>>, old::Error>;

impl v2::wisp::plugin0_2_0::models::Host for State {
    fn infer(
        &mut self,
        model: String,
        version: Option<u64>,
        batch: Vec<old::RequestResult>,
    ) -> wasmtime::Result<OldCalled> {
        let called: Called =
            self.call_model(&model, version, batch.into_iter().map(request).collect());
        Ok(called
            .map(|results| {
                results
                    .into_iter()
                    .map(|r| r.map(response_back).map_err(error_back))
                    .collect()
            })
            .map_err(error_back))
    }
}
