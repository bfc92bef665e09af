//! The `wisp:plugin/models` import (0.3.0; 0.2.0 through [`crate::compat`]): a plugin calls the server's models with the same
//! requests and tensors it receives — every datatype, parameters, requested outputs — a whole
//! list at a time, so that the called model's scheduler batches them.

use std::time::Instant;

use bytes::Bytes;
use wisp_core::infer::MAX_CALL_DEPTH;
use wisp_core::{Error, ErrorKind, InferRequest, InferResponse, Tensor};

use crate::host::{from_wit_datatype, to_wit_datatype, v3, wit, State};

/// What `infer` returns to the guest.
pub(crate) type Called =
    std::result::Result<Vec<std::result::Result<wit::Response, wit::Error>>, wit::Error>;

impl v3::wisp::plugin0_3_0::models::Host for State {
    fn infer(
        &mut self,
        model: String,
        version: Option<u64>,
        batch: Vec<wit::RequestResult>,
    ) -> wasmtime::Result<Called> {
        Ok(self.call_model(&model, version, batch))
    }
}

impl State {
    pub(crate) fn call_model(
        &mut self,
        model: &str,
        version: Option<u64>,
        batch: Vec<wit::RequestResult>,
    ) -> Called {
        let Some(caller) = self.caller.clone() else {
            return Err(to_wit_error(&Error::unsupported(
                "this host serves no models to plugins",
            )));
        };
        if &*self.model == model || self.call_path.iter().any(|m| &**m == model) {
            let path: Vec<&str> = self.call_path.iter().map(|m| &**m).collect();
            return Err(to_wit_error(&Error::invalid(format!(
                "model '{model}' is already on this call's path ({} → {model}): a plugin cannot call itself or a model that called it",
                path.join(" → ")
            ))));
        }
        if self.call_path.len() >= MAX_CALL_DEPTH {
            return Err(to_wit_error(&Error::invalid(format!(
                "calls nest more than {MAX_CALL_DEPTH} models deep"
            ))));
        }
        if Instant::now() >= self.deadline {
            return Err(to_wit_error(&Error::unavailable(
                "the plugin's deadline passed before the call",
            )));
        }
        // Requests that do not convert fail alone; the rest go to the model together.
        let mut results: Vec<Option<std::result::Result<wit::Response, wit::Error>>> =
            Vec::with_capacity(batch.len());
        let mut requests = Vec::with_capacity(batch.len());
        for r in batch {
            match self.to_request(r) {
                Ok(req) => {
                    requests.push(req);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(to_wit_error(&e)))),
            }
        }
        let version = version.map(|v| v.to_string());
        let answers = if requests.is_empty() {
            Vec::new()
        } else {
            caller
                .infer_batch(model, version.as_deref(), requests, self.deadline)
                .map_err(|e| to_wit_error(&e.context(format!("model '{model}'"))))?
        };
        let mut answers = answers.into_iter();
        Ok(results
            .into_iter()
            .map(|slot| match slot {
                Some(failed) => failed,
                None => match answers.next() {
                    Some(Ok(r)) => Ok(to_wit_response(r)),
                    Some(Err(e)) => Err(to_wit_error(&e)),
                    None => Err(to_wit_error(&Error::internal(
                        "the model returned fewer results than requests",
                    ))),
                },
            })
            .collect())
    }

    /// A guest's request as a core request, made by this plugin's current batch.
    fn to_request(&self, r: wit::RequestResult) -> wisp_core::Result<InferRequest> {
        let mut inputs = Vec::with_capacity(r.inputs.len());
        for t in r.inputs {
            if let Some(d) = t.shape.iter().find(|&&d| d < 0) {
                return Err(Error::invalid(format!(
                    "input '{}' has a negative dimension {d}",
                    t.name
                )));
            }
            inputs.push(Tensor::new(
                t.name,
                from_wit_datatype(t.datatype),
                t.shape,
                Bytes::from(t.data),
            )?);
        }
        let parameters = r
            .parameters
            .into_iter()
            .map(|p| {
                let v = match p.value {
                    wit::ParamValueResult::Bool(b) => serde_json::Value::Bool(b),
                    wit::ParamValueResult::Int(i) => i.into(),
                    wit::ParamValueResult::Double(d) => serde_json::Number::from_f64(d)
                        .map_or(serde_json::Value::Null, serde_json::Value::Number),
                    wit::ParamValueResult::Text(s) => serde_json::Value::String(s),
                };
                (p.key, v)
            })
            .collect();
        Ok(InferRequest {
            id: r.id,
            inputs,
            requested_outputs: r.requested_outputs,
            parameters,
            trace: self.trace.clone(),
            call_path: self.call_path.clone(),
            ..Default::default()
        })
    }
}

/// A core response as the guest's.
fn to_wit_response(r: InferResponse) -> wit::Response {
    wit::Response {
        outputs: r
            .outputs
            .into_iter()
            .map(|t| wit::TensorResult {
                datatype: to_wit_datatype(t.datatype),
                data: t.data.to_vec(),
                shape: t.shape,
                name: t.name,
            })
            .collect(),
    }
}

/// A core error as the guest's, with the status it would have over HTTP.
pub(crate) fn to_wit_error(e: &Error) -> wit::Error {
    let code = match e.kind() {
        ErrorKind::InvalidArg | ErrorKind::TooLarge => wit::ErrorCode::InvalidArgument,
        ErrorKind::NotFound => wit::ErrorCode::NotFound,
        ErrorKind::Unsupported => wit::ErrorCode::Unsupported,
        ErrorKind::Unavailable | ErrorKind::Exhausted => wit::ErrorCode::Unavailable,
        ErrorKind::AlreadyExists | ErrorKind::Internal | ErrorKind::Forbidden => {
            wit::ErrorCode::Internal
        }
    };
    wit::Error {
        code,
        message: e.message().to_string(),
    }
}
