//! Protocol-neutral inference requests and responses, shared by every front end and backend.

use crate::config::Signature;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Request or response parameters: the JSON object of the KServe v2 `parameters` field.
pub type Parameters = serde_json::Map<String, serde_json::Value>;

/// One inference request after decoding and validation against the model's config.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    /// Client-chosen id, echoed in the response.
    pub id: String,
    /// Input tensors, full shape (batch dim included when the model batches).
    pub inputs: Vec<Tensor>,
    /// Outputs the client asked for; empty means all.
    pub requested_outputs: Vec<String>,
    /// Request parameters.
    pub parameters: Parameters,
    /// Priority and queue timeout, typed: set from `parameters` by
    /// [`Scheduling::from_parameters`] where a request enters the server.
    pub scheduling: Scheduling,
    /// Its place in a sequence (a stateful model's), typed: set from `parameters` by
    /// [`SequenceFlags::from_parameters`] where a request enters the server.
    pub sequence: Option<SequenceFlags>,
    /// The request's trace, when it was sampled for tracing (the trace extension).
    pub trace: Option<std::sync::Arc<crate::trace::Trace>>,
    /// The models whose execution made this request (the plugins and ensembles it was called
    /// from, outermost first; empty for a client's request): a plugin may not call a model on
    /// its own path, which would wait on itself.
    pub call_path: Vec<std::sync::Arc<str>>,
    /// Where a decoupled model's responses go while it executes this request (set by a front
    /// end that streams them: gRPC `ModelStreamInfer`, HTTP `generate_stream`); `None` for a
    /// request that takes exactly one response.
    pub responses: Option<std::sync::Arc<dyn ResponseSink>>,
}

/// One response of a decoupled model, sent while it executes.
#[derive(Debug)]
pub struct StreamedResponse {
    /// The response (`None`: only the final flag).
    pub response: Option<Result<InferResponse>>,
    /// The request's last response.
    pub last: bool,
}

/// Where a decoupled model's responses to one request go, in order
/// (`model_transaction_policy { decoupled: true }`). Implemented by the front end's stream;
/// called from the thread executing the model.
pub trait ResponseSink: Send + Sync + std::fmt::Debug {
    /// Queues `part` for the client. An implementation may wait for room at most until
    /// `deadline`; the server's own never waits (a model must not hold its instance for a
    /// client that does not read) and fails instead when its queue is full or the in-flight
    /// budget is spent. Fails when the client has gone.
    fn send(&self, part: StreamedResponse, deadline: std::time::Instant) -> Result<()>;

    /// Whether the client has gone (its stream closed): the model may stop producing.
    fn is_closed(&self) -> bool;
}

/// Parameters one request, or one of its tensors, may carry. Triton sets no bound; this one
/// keeps a request's memory proportional to what it means (two million parameters once took
/// 432 MB).
pub const MAX_PARAMETERS: usize = 128;

/// Refuses `count` parameters on `what` past [`MAX_PARAMETERS`].
pub fn check_parameter_count(count: usize, what: impl std::fmt::Display) -> Result<()> {
    if count > MAX_PARAMETERS {
        return Err(Error::invalid(format!(
            "{what} has {count} parameters, more than the {MAX_PARAMETERS} a request may carry"
        )));
    }
    Ok(())
}

/// Input or output tensors one request may name. Triton sets no bound; a model with more
/// inputs than this cannot load (a config allows 1024), and each named tensor costs a few
/// hundred bytes once decoded (an empty gRPC input is two bytes on the wire).
pub const MAX_REQUEST_TENSORS: usize = 4096;

/// Dimensions a request tensor's shape may have: a model's own rank is at most 32
/// ([`crate::config::bounds::MAX_RANK`]), plus the batch dimension.
pub const MAX_REQUEST_RANK: usize = 64;

/// Refuses `count` tensors of `kind` ("inputs", "outputs") past [`MAX_REQUEST_TENSORS`].
pub fn check_tensor_count(count: usize, kind: impl std::fmt::Display) -> Result<()> {
    if count > MAX_REQUEST_TENSORS {
        return Err(Error::invalid(format!(
            "the request has {count} {kind}, more than the {MAX_REQUEST_TENSORS} a request may name"
        )));
    }
    Ok(())
}

/// Refuses a shape of `rank` dimensions on `what` past [`MAX_REQUEST_RANK`].
pub fn check_rank(rank: usize, what: impl std::fmt::Display) -> Result<()> {
    if rank > MAX_REQUEST_RANK {
        return Err(Error::invalid(format!(
            "{what} has a shape of {rank} dimensions, more than the {MAX_REQUEST_RANK} a request may give"
        )));
    }
    Ok(())
}

/// The longest chain of plugin and ensemble calls a request may come from.
pub const MAX_CALL_DEPTH: usize = 16;

/// A sequence's correlation ID: Triton's `sequence_id`, an unsigned integer or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CorrelationId {
    /// A non-zero integer.
    Number(u64),
    /// A non-empty string.
    Text(String),
}

impl std::fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorrelationId::Number(n) => write!(f, "{n}"),
            CorrelationId::Text(s) => write!(f, "'{s}'"),
        }
    }
}

/// Triton's `sequence_id`, `sequence_start` and `sequence_end` request parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SequenceFlags {
    /// The sequence.
    pub id: CorrelationId,
    /// The request starts it.
    pub start: bool,
    /// The request ends it.
    pub end: bool,
}

/// The longest string correlation ID accepted.
pub const MAX_CORRELATION_ID_BYTES: usize = 256;

impl SequenceFlags {
    /// Reads the sequence parameters; `None` when there is no `sequence_id` (or it is 0 or
    /// empty, Triton's "no sequence"). A wrong type is an error naming the parameter.
    pub fn from_parameters(parameters: &Parameters) -> Result<Option<Self>> {
        let flag = |key: &str| match parameters.get(key) {
            None | Some(serde_json::Value::Null) => Ok(false),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Error::invalid(format!(
                "request parameter '{key}' must be a boolean, got {v}"
            ))),
        };
        let (start, end) = (flag("sequence_start")?, flag("sequence_end")?);
        let id = match parameters.get("sequence_id") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(s)) if s.len() > MAX_CORRELATION_ID_BYTES => {
                return Err(Error::invalid(format!(
                    "request parameter 'sequence_id' is longer than {MAX_CORRELATION_ID_BYTES} bytes"
                )))
            }
            Some(serde_json::Value::String(s)) => {
                (!s.is_empty()).then(|| CorrelationId::Text(s.clone()))
            }
            Some(v) => match v.as_u64() {
                Some(n) => (n != 0).then_some(CorrelationId::Number(n)),
                None => {
                    return Err(Error::invalid(format!(
                        "request parameter 'sequence_id' must be a non-negative integer or a string, got {v}"
                    )))
                }
            },
        };
        Ok(id.map(|id| SequenceFlags { id, start, end }))
    }
}

/// What a client may ask of the scheduler for one request: Triton's `priority` and `timeout`
/// request parameters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scheduling {
    /// Priority level, 1 the highest; 0 means the model's default level.
    pub priority: u64,
    /// Longest time the request may wait in the queue, in microseconds; 0 means the model's
    /// default.
    pub timeout_us: u64,
}

impl Scheduling {
    /// Reads `priority` and `timeout` from a request's parameters (absent or `null`: 0); any
    /// other value than a non-negative integer is an error naming the parameter.
    pub fn from_parameters(parameters: &Parameters) -> Result<Self> {
        let uint = |key: &str| match parameters.get(key) {
            None | Some(serde_json::Value::Null) => Ok(0),
            Some(v) => v.as_u64().ok_or_else(|| {
                Error::invalid(format!(
                    "request parameter '{key}' must be a non-negative integer, got {v}"
                ))
            }),
        };
        Ok(Scheduling {
            priority: uint("priority")?,
            timeout_us: uint("timeout")?,
        })
    }
}

impl InferRequest {
    /// Rows in this request's batch dimension (1 when the model does not batch).
    pub fn batch_size(&self, model_batches: bool) -> usize {
        if !model_batches {
            return 1;
        }
        self.inputs
            .first()
            .and_then(|t| t.shape.first())
            .map(|&d| d.max(0) as usize)
            .unwrap_or(1)
    }
}

/// The outputs produced for one request.
#[derive(Debug, Clone, Default)]
pub struct InferResponse {
    /// Output tensors.
    pub outputs: Vec<Tensor>,
    /// Where the model's compute time went for the batch this request ran in, as its
    /// statistics charge it (set by the scheduler; an ensemble adds its steps' up).
    pub compute: Option<crate::backend::ExecTiming>,
}

impl InferResponse {
    /// A response with `outputs`.
    pub fn new(outputs: Vec<Tensor>) -> Self {
        InferResponse {
            outputs,
            compute: None,
        }
    }
}

/// Checks a decoded request against its model's signature: every input known, given once, of
/// the configured datatype and shape (batch dimension within `max_batch_size`, the same for all
/// inputs), every required input present, every requested output known. Every entry point
/// (HTTP, gRPC, a plugin's wasi-nn call, an ensemble step) runs it before scheduling; errors
/// name the tensor.
pub fn validate(req: &InferRequest, sig: &Signature) -> Result<()> {
    let model = &sig.model;
    let mut batch: Option<i64> = None;
    for t in &req.inputs {
        let Some(c) = sig.input(&t.name) else {
            return Err(Error::invalid(format!(
                "unexpected inference input '{}' for model '{model}' (inputs: {})",
                t.name,
                sig.input_names()
            )));
        };
        if req.inputs.iter().filter(|o| o.name == t.name).count() > 1 {
            return Err(Error::invalid(format!(
                "input '{}' is given more than once",
                t.name
            )));
        }
        if c.datatype != t.datatype {
            return Err(Error::invalid(format!(
                "inference input '{}' data-type is '{}', but model '{model}' expects '{}'",
                t.name, t.datatype, c.datatype
            )));
        }
        let dims = if sig.batches() {
            let Some((&b, rest)) = t.shape.split_first() else {
                return Err(Error::invalid(format!(
                    "input '{}': shape [] has no batch dimension; model '{model}' expects [-1{}]",
                    t.name,
                    c.dims.iter().map(|d| format!(", {d}")).collect::<String>()
                )));
            };
            if b < 1 || b > i64::from(sig.max_batch_size) {
                return Err(Error::invalid(format!(
                    "input '{}': batch size {b} is outside 1..={} for model '{model}'",
                    t.name, sig.max_batch_size
                )));
            }
            if *batch.get_or_insert(b) != b {
                return Err(Error::invalid(format!(
                    "input '{}': batch size {b} differs from the other inputs' {}",
                    t.name,
                    batch.unwrap_or_default()
                )));
            }
            rest
        } else {
            &t.shape[..]
        };
        let fits = dims.len() == c.dims.len()
            && dims
                .iter()
                .zip(&c.dims)
                .all(|(&got, &want)| want < 0 || got == want);
        if !fits {
            let expect: Vec<i64> = if sig.batches() {
                std::iter::once(-1).chain(c.dims.iter().copied()).collect()
            } else {
                c.dims.clone()
            };
            return Err(Error::invalid(format!(
                "unexpected shape for input '{}' for model '{model}'. Expected {expect:?}, got {:?}",
                t.name, t.shape
            )));
        }
    }
    for c in sig.inputs.iter().filter(|c| !c.optional) {
        if !req.inputs.iter().any(|t| t.name == c.name) {
            return Err(Error::invalid(format!(
                "expected {} inputs but got {} inputs for model '{model}': missing input '{}'",
                sig.inputs.iter().filter(|c| !c.optional).count(),
                req.inputs.len(),
                c.name
            )));
        }
    }
    for (i, name) in req.requested_outputs.iter().enumerate() {
        if req.requested_outputs[..i].contains(name) {
            return Err(Error::invalid(format!(
                "output '{name}' already exists in request"
            )));
        }
        if sig.output(name).is_none() {
            return Err(Error::invalid(format!(
                "unexpected inference output '{name}' for model '{model}' (outputs: {})",
                sig.output_names()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod scheduling_tests {
    use super::*;

    #[test]
    fn priority_and_timeout_are_read_and_bad_values_named() {
        let p = |v: serde_json::Value| v.as_object().cloned().unwrap();
        assert_eq!(
            Scheduling::from_parameters(&p(serde_json::json!({}))).unwrap(),
            Scheduling::default()
        );
        assert_eq!(
            Scheduling::from_parameters(&p(serde_json::json!({"priority": 2, "timeout": 5000})))
                .unwrap(),
            Scheduling {
                priority: 2,
                timeout_us: 5000
            }
        );
        let e =
            Scheduling::from_parameters(&p(serde_json::json!({"priority": "high"}))).unwrap_err();
        assert!(e.message().contains("'priority'"), "{e}");
        let e = Scheduling::from_parameters(&p(serde_json::json!({"timeout": -1}))).unwrap_err();
        assert!(e.message().contains("'timeout'"), "{e}");
    }
}

#[cfg(test)]
mod validate_tests {
    use super::*;
    use crate::config::TensorSpec;

    #[test]
    fn an_output_requested_twice_is_named() {
        let cfg = Signature {
            model: "m".into(),
            max_batch_size: 0,
            inputs: vec![],
            outputs: vec![TensorSpec {
                name: "y".into(),
                datatype: crate::DataType::Fp32,
                dims: vec![1],
                reshape: None,
                optional: false,
            }],
        };
        let mut req = InferRequest {
            requested_outputs: vec!["y".into()],
            ..Default::default()
        };
        validate(&req, &cfg).unwrap();
        req.requested_outputs.push("y".into());
        let e = validate(&req, &cfg).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArg);
        assert!(
            e.message().contains("output 'y' already exists in request"),
            "{e}"
        );
    }
}
