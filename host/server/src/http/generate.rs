//! Triton's generate extension (provisional in Triton): `POST /v2/models/{m}[/versions/{v}]/generate`
//! answers one JSON object, `…/generate_stream` answers each of a decoupled model's responses as
//! a Server-Sent Event (`data: {…}\n\n`).
//!
//! The request is a flat JSON object: a key naming one of the model's inputs is that input (a
//! scalar or an array, nested or flat), `parameters` holds request parameters, and any other
//! key is a parameter too. An input's shape is its config dims with the element count in its
//! first variable dim (and a batch of one for a batching model). A response holds
//! `model_name`, `model_version` and each output by name: a scalar when it has one element,
//! else a flat array.
//!
//! A request that fails before the model answers gets an ordinary JSON error with its status;
//! once a stream has started (status 200), a failure is an event `data: {"error": "…"}`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use tokio::sync::mpsc;
use wisp_core::config::{Signature, TensorSpec};
use wisp_core::tensor::decode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, Result, Tensor};

use super::*;
use crate::service::stream::{Part, STREAM_BUFFER};
use crate::service::{Answer, Decoded};

/// `generate` (one JSON response) or `generate_stream` (SSE), for `model`.
pub(super) async fn generate(
    app: &AppState,
    model: &str,
    version: Option<&str>,
    req: Request,
    stream: bool,
) -> ApiResult {
    let m = app.service.model(model, version)?;
    let received = Instant::now();
    let (parts, body) = req.into_parts();
    // A decoupled request holds one of its connection's slots until its response has been
    // handed to the connection (or dropped with it): its queued events count, not only its run.
    let slot = match parts.extensions.get::<crate::conn::DecoupledSlots>() {
        Some(slots) if m.config.decoupled() => Some(slots.take()?),
        _ => None,
    };
    let (body, mut budget) = read_body(app, &parts.headers, body).await?;
    // A JSON value tree costs up to 16 times its text (see the embeddings route).
    budget.grow_to((body.len() as u64).saturating_mul(16))?;
    let decoded = if body.len() > INLINE_DECODE_BYTES {
        let sig = m.signature.clone();
        tokio::task::spawn_blocking(move || decode(&body, &sig))
            .await
            .map_err(|_| Error::internal("request decoding panicked"))?
    } else {
        decode(&body, &m.signature)
    };
    let parent = trace_parent(&parts.headers);
    let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
    let service = Arc::clone(&app.service);
    let m2 = Arc::clone(&m);
    // The run owns the budget charge: it lasts as long as the request's memory does.
    tokio::spawn(async move {
        let _budget = budget;
        if m2.config.decoupled() {
            service
                .infer_stream(m2, decoded, received, parent, tx)
                .await;
        } else {
            let answer = service.infer(m2, decoded, received, parent).await;
            let _ = tx
                .send(Part {
                    answer: Some(answer),
                    last: true,
                    held: None,
                })
                .await;
        }
    });
    if !stream {
        let _slot = slot;
        return Ok(json_response(one_answer(&m.name, &mut rx).await?));
    }
    // The first part decides the status: a failure before any response is a plain error.
    let first = match rx.recv().await {
        Some(Part {
            answer: Some(Err(e)),
            ..
        }) => return Err(e.into()),
        Some(part) => Some(part),
        None => None,
    };
    let events =
        futures_util::stream::unfold((first, rx, slot), |(pending, mut rx, slot)| async move {
            let part = match pending {
                Some(p) => p,
                None => rx.recv().await?,
            };
            let last = part.last;
            let event = |answer: Option<Result<Answer>>| {
                let event = match answer {
                    Some(Ok(a)) => Some(response_json(&a).unwrap_or_else(|e| error_json(&e))),
                    Some(Err(e)) => Some(error_json(&e)),
                    None => None,
                };
                event.map_or_else(Bytes::new, |v| Bytes::from(format!("data: {v}\n\n")))
            };
            // A large event is encoded off the async workers (see `infer`).
            let large =
                matches!(&part.answer, Some(Ok(a)) if answer_bytes(a) > INLINE_DECODE_BYTES);
            let chunk = if large {
                let answer = part.answer;
                tokio::task::spawn_blocking(move || event(answer))
                    .await
                    .unwrap_or_else(|_| {
                        Bytes::from_static(b"data: {\"error\":\"response encoding panicked\"}\n\n")
                    })
            } else {
                event(part.answer)
            };
            if last {
                // Closing the receiver after the last part: nothing else is read.
                rx.close();
            }
            Some((Ok::<_, std::convert::Infallible>(chunk), (None, rx, slot)))
        });
    let mut resp = Response::new(Body::from_stream(events));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

/// The one response `generate` returns: an error if the model sent none or more than one.
async fn one_answer(model: &str, rx: &mut mpsc::Receiver<Part>) -> Result<Value> {
    let mut answer = None;
    while let Some(part) = rx.recv().await {
        match part.answer {
            Some(Err(e)) => return Err(e),
            Some(Ok(a)) if answer.is_none() => answer = Some(response_json(&a)?),
            Some(Ok(_)) => {
                return Err(Error::unsupported(format!(
                    "model '{model}' sent more than one response: use generate_stream"
                )))
            }
            None => {}
        }
        if part.last {
            break;
        }
    }
    answer.ok_or_else(|| Error::internal(format!("model '{model}' sent no response")))
}

fn error_json(e: &Error) -> Value {
    serde_json::json!({ "error": e.message() })
}

/// A response object: model name and version, and each output by name.
fn response_json(a: &Answer) -> Result<Value> {
    let mut out = Map::new();
    out.insert("model_name".into(), a.model.name.clone().into());
    out.insert("model_version".into(), a.model.version.to_string().into());
    if !a.id.is_empty() {
        out.insert("id".into(), a.id.clone().into());
    }
    for (_, t) in &a.outputs {
        out.insert(t.name.clone(), output_json(t)?);
    }
    Ok(Value::Object(out))
}

/// An output as JSON: a scalar for one element, else a flat array. BYTES must be UTF-8 text.
fn output_json(t: &Tensor) -> Result<Value> {
    if t.datatype == DataType::Bytes {
        let els = decode_bytes_elements(&t.data)?;
        if els.iter().any(|e| std::str::from_utf8(e).is_err()) {
            return Err(Error::invalid(format!(
                "output '{}' holds bytes that are not UTF-8: generate returns text, use infer for binary data",
                t.name
            )));
        }
    }
    Ok(match codec::tensor_to_json(t) {
        Value::Array(mut v) if v.len() == 1 => v.pop().unwrap_or(Value::Null),
        other => other,
    })
}

/// A generate request → the service's [`Decoded`].
pub(crate) fn decode(body: &[u8], sig: &Signature) -> Result<Decoded> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(fields) = v else {
        return Err(Error::invalid("the request body must be a JSON object"));
    };
    let mut request = InferRequest::default();
    for (key, value) in fields {
        if let Some(spec) = sig.input(&key) {
            request.inputs.push(input(spec, sig.batches(), &value)?);
            continue;
        }
        if key == "parameters" {
            let Value::Object(params) = value else {
                return Err(Error::invalid("'parameters' must be a JSON object"));
            };
            for (k, p) in params {
                let (k, p) = parameter(&k, p)?;
                request.parameters.insert(k, p);
            }
            continue;
        }
        let (k, p) = parameter(&key, value)?;
        request.parameters.insert(k, p);
    }
    Ok(Decoded {
        request,
        outputs: Vec::new(),
        binary_default: false,
        shm_inputs: Vec::new(),
        shm_scope: Default::default(),
    })
}

/// A parameter: a string, number or boolean.
fn parameter(key: &str, value: Value) -> Result<(String, Value)> {
    match value {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok((key.to_string(), value)),
        _ => Err(Error::invalid(format!(
            "'{key}' is neither an input of the model nor a parameter (a string, number or boolean)"
        ))),
    }
}

/// Elements in a JSON value: one for a scalar, the leaves of an array.
fn leaves(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// One input from its JSON value, shaped by its config dims.
fn input(spec: &TensorSpec, batched: bool, value: &Value) -> Result<Tensor> {
    let count = leaves(value);
    let mut shape = shape_for(spec, count)?;
    if batched {
        shape.insert(0, 1);
    }
    let text = match value {
        Value::Array(_) => value.to_string(),
        scalar => format!("[{scalar}]"),
    };
    let data = codec::json_data_decode(spec.datatype, &text, count)
        .map_err(|e| e.context(format!("input '{}'", spec.name)))?;
    Tensor::new(spec.name.clone(), spec.datatype, shape, data.into())
        .map_err(|e| e.context(format!("input '{}'", spec.name)))
}

/// The shape `count` elements take for `spec` (without the batch dim): its dims, the first
/// variable one holding what the fixed ones leave and any others 1.
fn shape_for(spec: &TensorSpec, count: usize) -> Result<Vec<i64>> {
    let fixed = spec
        .dims
        .iter()
        .filter(|&&d| d >= 0)
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
    let variable = spec.dims.iter().position(|&d| d < 0);
    let mismatch = || {
        Error::invalid(format!(
            "input '{}': {count} elements do not fit its shape {:?}",
            spec.name, spec.dims
        ))
    };
    let fixed = fixed.ok_or_else(mismatch)?;
    let mut shape = spec.dims.clone();
    match variable {
        None if fixed == count => {}
        None => return Err(mismatch()),
        Some(first) => {
            let fill = match (count, fixed) {
                (0, _) => 0,
                (_, 0) => return Err(mismatch()),
                (c, f) if c % f == 0 => c / f,
                _ => return Err(mismatch()),
            };
            for (i, d) in shape.iter_mut().enumerate() {
                if *d < 0 {
                    *d = if i == first {
                        i64::try_from(fill).map_err(|_| mismatch())?
                    } else {
                        1
                    };
                }
            }
        }
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, dt: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype: dt,
            dims: dims.to_vec(),
            reshape: None,
            optional: false,
        }
    }

    #[test]
    fn shapes_fill_the_first_variable_dim() {
        let s = spec("x", DataType::Fp32, &[-1, 4]);
        assert_eq!(shape_for(&s, 8).unwrap(), vec![2, 4]);
        assert!(shape_for(&s, 6).is_err());
        let s = spec("x", DataType::Fp32, &[2, 3]);
        assert_eq!(shape_for(&s, 6).unwrap(), vec![2, 3]);
        assert!(shape_for(&s, 5)
            .unwrap_err()
            .message()
            .contains("input 'x'"));
        let s = spec("x", DataType::Fp32, &[-1, -1]);
        assert_eq!(shape_for(&s, 5).unwrap(), vec![5, 1]);
        let s = spec("x", DataType::Fp32, &[i64::MAX, i64::MAX, -1]);
        assert!(shape_for(&s, 5).is_err());
    }

    #[test]
    fn inputs_and_parameters_from_one_object() {
        let sig = Signature {
            model: "m".into(),
            max_batch_size: 8,
            inputs: vec![
                spec("text_input", DataType::Bytes, &[1]),
                spec("audio", DataType::Fp32, &[-1]),
            ],
            outputs: vec![],
        };
        let body = br#"{"text_input": "hi", "audio": [[0.5, 1.5], [2.5]], "stream": true,
                         "parameters": {"temperature": 0.2}}"#;
        let d = decode(body, &sig).unwrap();
        let audio = d.request.inputs.iter().find(|t| t.name == "audio").unwrap();
        assert_eq!(audio.shape, vec![1, 3]);
        let text = d
            .request
            .inputs
            .iter()
            .find(|t| t.name == "text_input")
            .unwrap();
        assert_eq!(text.shape, vec![1, 1]);
        assert_eq!(d.request.parameters["stream"], Value::Bool(true));
        assert_eq!(d.request.parameters["temperature"], serde_json::json!(0.2));
        let bad = decode(br#"{"other": {"a": 1}}"#, &sig).unwrap_err();
        assert!(bad.message().contains("'other'"), "{}", bad.message());
        assert!(decode(b"[1]", &sig).is_err());
        assert!(decode(br#"{"audio": ["x"]}"#, &sig).is_err());
    }
}
