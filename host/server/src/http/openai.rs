//! The OpenAI-compatible routes on the HTTP port, a codec over [`crate::service::openai`]:
//!
//! - `POST /v1/embeddings` — `model`, `input` (a string or a list of strings),
//!   `encoding_format` (`float`, the default, or `base64`: little-endian f32 bytes), `dimensions`
//!   and `user` (accepted, unused). The answer is OpenAI's `list` of `embedding` objects with
//!   `usage` token counts.
//! - `GET /v1/models` and `GET /v1/models/{id}` — the models that join the API.
//!
//! Errors are OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, with
//! the status the service's error kind maps to (the same table as KServe v2's).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Value};
use wisp_core::Error;

use super::error::status;
use super::{read_body, AppState};
use crate::service::openai::{ApiFailure, ApiModel};

/// Answers an OpenAI route (`segs` starts with `v1`).
pub async fn route(app: &AppState, segs: &[&str], method: &Method, req: Request) -> Response {
    let result = match (segs, method) {
        (["v1", "embeddings"], &Method::POST) => embeddings(app, req).await,
        (["v1", "models"], &Method::GET) => Ok(models(app)),
        (["v1", "models", id], &Method::GET) => app
            .service
            .api_model(id)
            .map(|m| axum::Json(model_json(&m)).into_response()),
        (["v1", "embeddings"], _) => Ok(not_allowed(method, "POST")),
        (["v1", "models"] | ["v1", "models", _], _) => Ok(not_allowed(method, "GET")),
        _ => Err(ApiFailure {
            error: Error::not_found(format!(
                "no route for {method} /{}: this server implements /v1/embeddings and /v1/models",
                segs.join("/")
            )),
            param: None,
            code: Some("unknown_url"),
        }),
    };
    result.unwrap_or_else(error_response)
}

/// 405 with `Allow`, in OpenAI's error object.
fn not_allowed(method: &Method, want: &'static str) -> Response {
    let mut resp = error_with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method {method} not allowed here, use {want}"),
        None,
        Some("method_not_allowed"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(want));
    resp
}

/// OpenAI's error object for `f`, with the status its kind maps to.
pub fn error_response(f: ApiFailure) -> Response {
    error_with_status(status(f.error.kind()), f.error.message(), f.param, f.code)
}

/// OpenAI's error object with an explicit status.
pub fn error_with_status(
    status: StatusCode,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_exceeded",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    let body = json!({ "error": {
        "message": message, "type": kind, "param": param, "code": code,
    }});
    (status, axum::Json(body)).into_response()
}

fn model_json(m: &ApiModel) -> Value {
    json!({ "id": m.id, "object": "model", "created": m.created, "owned_by": "wisp" })
}

fn models(app: &AppState) -> Response {
    let data: Vec<Value> = app.service.api_models().iter().map(model_json).collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `encoding_format`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoding {
    Float,
    Base64,
}

/// A parsed `/v1/embeddings` body.
#[derive(Debug, PartialEq)]
pub(crate) struct EmbeddingsBody {
    model: String,
    /// The texts to embed, in order.
    pub(crate) texts: Vec<String>,
    encoding: Encoding,
    dimensions: Option<u64>,
}

pub(crate) fn parse(body: &[u8]) -> Result<EmbeddingsBody, ApiFailure> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiFailure::from(Error::invalid(format!(
            "the request body is not valid JSON: {e}"
        )))
    })?;
    let Value::Object(mut fields) = value else {
        return Err(ApiFailure::from(Error::invalid(
            "the request body must be a JSON object",
        )));
    };
    let model = match fields.remove("model") {
        Some(Value::String(m)) if !m.is_empty() => m,
        None | Some(Value::Null) => {
            return Err(ApiFailure::invalid(
                "model",
                "you must provide a model parameter",
            ))
        }
        Some(_) => {
            return Err(ApiFailure::invalid(
                "model",
                "'model' must be a non-empty string",
            ))
        }
    };
    let texts = match fields.remove("input") {
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            let mut texts = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Value::String(s) => texts.push(s),
                    Value::Number(_) | Value::Array(_) => {
                        return Err(ApiFailure::invalid(
                            "input",
                            "'input' as token ids is not supported: send text",
                        ))
                    }
                    _ => {
                        return Err(ApiFailure::invalid(
                            "input",
                            format!("'input' item {i} must be a string"),
                        ))
                    }
                }
            }
            texts
        }
        None | Some(Value::Null) => {
            return Err(ApiFailure::invalid(
                "input",
                "you must provide an input parameter",
            ))
        }
        Some(_) => {
            return Err(ApiFailure::invalid(
                "input",
                "'input' must be a string or a list of strings",
            ))
        }
    };
    let encoding = match fields.remove("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(other) => {
            return Err(ApiFailure::invalid(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', not {other}"),
            ))
        }
    };
    let dimensions = match fields.remove("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|&d| d >= 1).ok_or_else(|| {
            ApiFailure::invalid(
                "dimensions",
                format!("'dimensions' must be a positive integer, not {v}"),
            )
        })?),
    };
    match fields.remove("user") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => return Err(ApiFailure::invalid("user", "'user' must be a string")),
    }
    Ok(EmbeddingsBody {
        model,
        texts,
        encoding,
        dimensions,
    })
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
struct Answer {
    object: &'static str,
    data: Vec<Item>,
    model: String,
    usage: Usage,
}

async fn embeddings(app: &AppState, req: Request) -> Result<Response, ApiFailure> {
    let received = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let (body, mut budget) = read_body(app, &parts.headers, body).await?;
    // Parsing builds a JSON value tree, up to 16 times the text (`[1,1,…]`: 32 bytes a value
    // for 2 bytes of text), before the texts become one tensor per chunk: charged first.
    budget.grow_to((body.len() as u64).saturating_mul(16))?;
    // A large body is parsed on the blocking pool, as KServe bodies are decoded, so that it
    // cannot stall health checks.
    let parsed = if body.len() > super::body::INLINE_DECODE_BYTES {
        tokio::task::spawn_blocking(move || parse(&body))
            .await
            .map_err(|_| Error::internal("request parsing panicked"))??
    } else {
        parse(&body)?
    };
    let trace_parent = super::trace_parent(&parts.headers);
    let out = app
        .service
        .embed(
            &parsed.model,
            parsed.texts,
            parsed.dimensions,
            received,
            trace_parent,
        )
        .await?;
    let encode = |v: Vec<f32>| match parsed.encoding {
        Encoding::Float => Vector::Float(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    };
    let texts_count = out.vectors.len();
    let answer = Answer {
        object: "list",
        data: out
            .vectors
            .into_iter()
            .enumerate()
            .map(|(index, v)| Item {
                object: "embedding",
                index,
                embedding: encode(v),
            })
            .collect(),
        model: out.model,
        usage: Usage {
            prompt_tokens: out.prompt_tokens,
            total_tokens: out.prompt_tokens,
        },
    };
    let encode_answer = move || {
        serde_json::to_vec(&answer)
            .map_err(|e| Error::internal(format!("encoding the answer: {e}")))
    };
    // Hundreds of vectors are megabytes of JSON: written on the blocking pool.
    let json = if texts_count > 64 {
        tokio::task::spawn_blocking(encode_answer)
            .await
            .map_err(|_| Error::internal("answer encoding panicked"))??
    } else {
        encode_answer()?
    };
    let mut resp = Response::new(Body::from(json));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(body: &str) -> Option<&'static str> {
        parse(body.as_bytes()).unwrap_err().param
    }

    #[test]
    fn parses_strings_lists_and_options() {
        let b = parse(br#"{"model":"m","input":"hi"}"#).unwrap();
        assert_eq!(b.texts, vec!["hi"]);
        assert_eq!((b.encoding, b.dimensions), (Encoding::Float, None));
        let b = parse(
            br#"{"model":"m","input":["a","b"],"encoding_format":"base64","dimensions":8,"user":"u"}"#,
        )
        .unwrap();
        assert_eq!(b.texts, vec!["a", "b"]);
        assert_eq!((b.encoding, b.dimensions), (Encoding::Base64, Some(8)));
    }

    #[test]
    fn names_the_field_at_fault() {
        assert_eq!(param_of(r#"{"input":"x"}"#), Some("model"));
        assert_eq!(param_of(r#"{"model":3,"input":"x"}"#), Some("model"));
        assert_eq!(param_of(r#"{"model":"m"}"#), Some("input"));
        assert_eq!(param_of(r#"{"model":"m","input":[1,2]}"#), Some("input"));
        assert_eq!(
            param_of(r#"{"model":"m","input":["a",null]}"#),
            Some("input")
        );
        assert_eq!(param_of(r#"{"model":"m","input":{}}"#), Some("input"));
        assert_eq!(
            param_of(r#"{"model":"m","input":"x","encoding_format":"hex"}"#),
            Some("encoding_format")
        );
        assert_eq!(
            param_of(r#"{"model":"m","input":"x","dimensions":0}"#),
            Some("dimensions")
        );
        assert_eq!(
            param_of(r#"{"model":"m","input":"x","dimensions":-3}"#),
            Some("dimensions")
        );
        assert_eq!(param_of(r#"[1]"#), None);
        assert_eq!(param_of(r#"{"model""#), None);
    }
}
