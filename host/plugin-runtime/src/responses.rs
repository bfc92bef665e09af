//! The `wisp:plugin/responses` import (0.3.0): a decoupled model sends zero or more responses
//! per request while `execute` runs, each checked against the config as `execute`'s results
//! are, and passed at once to the client's stream (gRPC `ModelStreamInfer`, HTTP
//! `generate_stream`).

use wisp_core::config::Signature;
use wisp_core::infer::StreamedResponse;
use wisp_core::{Error, InferResponse, Tensor};

use crate::host::{self, v3, wit, State};
use crate::models::to_wit_error;

impl v3::wisp::plugin0_3_0::responses::Host for State {
    fn send(
        &mut self,
        request: u32,
        response: Option<std::result::Result<wit::Response, wit::Error>>,
        last: bool,
    ) -> wasmtime::Result<std::result::Result<(), wit::Error>> {
        Ok(self
            .send_response(request, response, last)
            .map_err(|e| to_wit_error(&e)))
    }

    fn is_cancelled(&mut self, request: u32) -> wasmtime::Result<bool> {
        Ok(self
            .streams
            .get(request as usize)
            .and_then(|s| s.sink.as_ref())
            .is_some_and(|sink| sink.is_closed()))
    }
}

impl State {
    pub(crate) fn send_response(
        &mut self,
        request: u32,
        response: Option<std::result::Result<wit::Response, wit::Error>>,
        last: bool,
    ) -> wisp_core::Result<()> {
        if !self.decoupled {
            return Err(Error::unsupported(format!(
                "model '{}' is not decoupled: return each request's response from execute, or set model_transaction_policy {{ decoupled: true }} in its config to send responses",
                self.model
            )));
        }
        let batch = self.streams.len();
        let Some(stream) = self.streams.get_mut(request as usize) else {
            return Err(Error::invalid(format!(
                "request {request} is not in the batch being executed ({batch} requests)"
            )));
        };
        if stream.finished {
            return Err(Error::invalid(format!(
                "request {request}'s final response was sent already"
            )));
        }
        let Some(sink) = stream.sink.clone() else {
            return Err(Error::unsupported(format!(
                "request {request} came from a client that takes one response (HTTP infer, gRPC ModelInfer, an ensemble or a plugin): return it from execute"
            )));
        };
        let response = match response {
            None if !last => {
                return Err(Error::invalid(
                    "a response may be none only when it is final (the flag alone)",
                ))
            }
            None => None,
            Some(Err(e)) => Some(Err(host::from_wit_error(e))),
            Some(Ok(r)) => {
                let sig = self
                    .signature
                    .as_ref()
                    .ok_or_else(|| Error::internal("no signature to check responses against"))?;
                Some(Ok(check_response(sig, stream.rows, r, false)?))
            }
        };
        sink.send(StreamedResponse { response, last }, self.deadline)?;
        if last {
            stream.finished = true;
        }
        Ok(())
    }
}

/// Checks one response against the config and its request (`rows`: the request's batch size).
/// `empty_ok`: a response without outputs passes (a decoupled model's execute result, closing
/// its request). An output the plugin leaves out, asked for or not, is absent, not an error
/// here: an ensemble skips what needs it, and a client that named it is told by the front end.
pub(crate) fn check_response(
    sig: &Signature,
    rows: i64,
    response: wit::Response,
    empty_ok: bool,
) -> wisp_core::Result<InferResponse> {
    if empty_ok && response.outputs.is_empty() {
        return Ok(InferResponse::new(Vec::new()));
    }
    let batched = sig.batches();
    let mut outputs = Vec::with_capacity(response.outputs.len());
    for t in response.outputs {
        let t = host::from_wit_tensor(t)?;
        let Some(c) = sig.output(&t.name) else {
            return Err(Error::internal(format!(
                "returned output '{}', which the config does not declare",
                t.name
            )));
        };
        if outputs.iter().any(|o: &Tensor| o.name == t.name) {
            return Err(Error::internal(format!(
                "returned output '{}' twice",
                t.name
            )));
        }
        if c.datatype != t.datatype {
            return Err(Error::internal(format!(
                "returned output '{}' as {}, the config declares {}",
                t.name,
                t.datatype,
                c.datatype.config_name()
            )));
        }
        let dims: &[i64] = &t.shape;
        let ok = if batched {
            dims.len() == c.dims.len() + 1 && dims[0] == rows && dims_match(&dims[1..], &c.dims)
        } else {
            dims_match(dims, &c.dims)
        };
        if !ok {
            let want = if batched {
                format!("[{rows}] + {:?}", c.dims)
            } else {
                format!("{:?}", c.dims)
            };
            return Err(Error::internal(format!(
                "returned output '{}' with shape {:?}, the config declares {want}",
                t.name, t.shape
            )));
        }
        outputs.push(t);
    }
    Ok(InferResponse::new(outputs))
}

fn dims_match(got: &[i64], want: &[i64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(&g, &w)| w < 0 || g == w)
}
