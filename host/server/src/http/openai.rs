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
use serde::de::DeserializeSeed;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use wisp_core::Error;

use super::error::status;
use super::{read_body, AppState};
use crate::service::openai::{ApiFailure, ApiModel, MAX_INPUTS};

/// 405 with `Allow`, in OpenAI's error object.
pub(super) fn not_allowed(method: &Method, want: &'static str) -> Response {
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

/// `GET /v1/models`.
pub(super) fn models(app: &AppState) -> Response {
    let data: Vec<Value> = app.service.api_models().iter().map(model_json).collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /v1/models/{id}`.
pub(super) fn model(app: &AppState, id: &str) -> Response {
    match app.service.api_model(id) {
        Ok(m) => axum::Json(model_json(&m)).into_response(),
        Err(failure) => error_response(failure),
    }
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

/// Parses an embeddings body without building a JSON tree: only the fields it uses are read,
/// and `input` goes straight to strings, at most [`MAX_INPUTS`] of them (OpenAI's limit), so
/// parsing holds little more than the texts themselves (a tree of 12 million one-character
/// texts once took ten times their bytes).
pub(crate) fn parse(body: &[u8]) -> Result<EmbeddingsBody, ApiFailure> {
    let [model, input, encoding, dimensions, user] = super::codec::pick(
        body,
        ["model", "input", "encoding_format", "dimensions", "user"],
    )
    .map_err(|e| {
        ApiFailure::from(Error::invalid(match e.classify() {
            serde_json::error::Category::Data => "the request body must be a JSON object".into(),
            _ => format!("the request body is not valid JSON: {e}"),
        }))
    })?;
    // An absent field and a null one are the same.
    fn given(r: Option<&RawValue>) -> Option<&RawValue> {
        r.filter(|r| r.get() != "null")
    }
    let Some(model) = given(model) else {
        return Err(ApiFailure::invalid(
            "model",
            "you must provide a model parameter",
        ));
    };
    let model = serde_json::from_str::<String>(model.get())
        .ok()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiFailure::invalid("model", "'model' must be a non-empty string"))?;
    let Some(input) = given(input) else {
        return Err(ApiFailure::invalid(
            "input",
            "you must provide an input parameter",
        ));
    };
    let mut fault = None;
    let texts = Texts { fault: &mut fault }
        .deserialize(&mut serde_json::Deserializer::from_str(input.get()));
    let texts = match (texts, fault) {
        (_, Some(f)) => return Err(f),
        (Ok(texts), None) => texts,
        (Err(_), None) => {
            return Err(ApiFailure::invalid(
                "input",
                "'input' must be a string or a list of strings",
            ))
        }
    };
    let encoding = match given(encoding) {
        None => Encoding::Float,
        Some(r) => match serde_json::from_str::<String>(r.get()).as_deref() {
            Ok("float") => Encoding::Float,
            Ok("base64") => Encoding::Base64,
            _ => {
                return Err(ApiFailure::invalid(
                    "encoding_format",
                    format!(
                        "'encoding_format' must be 'float' or 'base64', not {}",
                        excerpt(r)
                    ),
                ))
            }
        },
    };
    let dimensions = given(dimensions)
        .map(|r| {
            serde_json::from_str::<u64>(r.get())
                .ok()
                .filter(|&d| d >= 1)
                .ok_or_else(|| {
                    ApiFailure::invalid(
                        "dimensions",
                        format!(
                            "'dimensions' must be a positive integer, not {}",
                            excerpt(r)
                        ),
                    )
                })
        })
        .transpose()?;
    if let Some(r) = given(user) {
        if !r.get().starts_with('"') {
            return Err(ApiFailure::invalid("user", "'user' must be a string"));
        }
    }
    Ok(EmbeddingsBody {
        model,
        texts,
        encoding,
        dimensions,
    })
}

/// At most the first 40 characters of a JSON value, for an error message.
fn excerpt(raw: &RawValue) -> String {
    let text = raw.get();
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// `input`: one string, or a list of at most [`MAX_INPUTS`] strings; a fault names the field
/// in `fault` (the deserializer's own error then only stops the parse).
struct Texts<'f> {
    fault: &'f mut Option<ApiFailure>,
}

impl Texts<'_> {
    fn fail<E: serde::de::Error>(&mut self, message: String) -> E {
        *self.fault = Some(ApiFailure::invalid("input", message));
        E::custom("input")
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Texts<'_> {
    type Value = Vec<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Texts<'_> {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or a list of strings")
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<String>, E> {
        Ok(vec![s.to_string()])
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        mut self,
        mut seq: A,
    ) -> Result<Vec<String>, A::Error> {
        let mut texts = Vec::new();
        while let Some(item) = seq.next_element::<InputItem>()? {
            let i = texts.len();
            match item {
                InputItem::Text(s) if i < MAX_INPUTS => texts.push(s),
                InputItem::Text(_) => {
                    return Err(self.fail(format!(
                        "'input' holds more than {MAX_INPUTS} texts, the most a request may carry"
                    )))
                }
                InputItem::Tokens => {
                    return Err(self.fail("'input' as token ids is not supported: send text".into()))
                }
                InputItem::Other => {
                    return Err(self.fail(format!("'input' item {i} must be a string")))
                }
            }
        }
        Ok(texts)
    }
}

/// One item of `input`: a text, token ids (a number or a list, skipped unread), or neither.
enum InputItem {
    Text(String),
    Tokens,
    Other,
}

impl<'de> serde::Deserialize<'de> for InputItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<InputItem, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = InputItem;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<InputItem, E> {
                Ok(InputItem::Text(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<InputItem, E> {
                Ok(InputItem::Text(s))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<InputItem, E> {
                Ok(InputItem::Tokens)
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<InputItem, E> {
                Ok(InputItem::Tokens)
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<InputItem, E> {
                Ok(InputItem::Tokens)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<InputItem, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(InputItem::Tokens)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<InputItem, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(InputItem::Other)
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<InputItem, E> {
                Ok(InputItem::Other)
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<InputItem, E> {
                Ok(InputItem::Other)
            }
        }
        d.deserialize_any(V)
    }
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

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(app: &AppState, req: Request) -> Result<Response, ApiFailure> {
    let received = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let (body, mut budget) = read_body(app, &parts.headers, body).await?;
    // Parsing holds the texts (at most the body's bytes) and a string each, at most
    // MAX_INPUTS of them; the requests built from them hold the texts again, as BYTES tensors.
    let strings = (MAX_INPUTS * (std::mem::size_of::<String>() + 32)) as u64;
    budget.grow_to(
        (body.len() as u64)
            .saturating_mul(3)
            .saturating_add(strings),
    )?;
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
        // fields it does not use are skipped, whatever they hold
        let b = parse(br#"{"x":[[1],{"y":2}],"model":"m","input":["a\u00e9"]}"#).unwrap();
        assert_eq!(b.texts, vec!["a\u{e9}"]);
    }

    #[test]
    fn more_texts_than_openai_takes_are_refused_while_parsing() {
        let body = |n: usize| {
            let items = vec![r#""a""#; n].join(",");
            format!(r#"{{"model":"m","input":[{items}]}}"#)
        };
        assert_eq!(
            parse(body(MAX_INPUTS).as_bytes()).unwrap().texts.len(),
            MAX_INPUTS
        );
        let f = parse(body(MAX_INPUTS + 1).as_bytes()).unwrap_err();
        assert_eq!(f.param, Some("input"));
        assert!(
            f.error.message().contains("more than 2048"),
            "{}",
            f.error.message()
        );
        // token ids are refused as such, nested or not, wherever they start
        let f = parse(br#"{"model":"m","input":["a",[1,2]]}"#).unwrap_err();
        assert!(
            f.error.message().contains("token ids"),
            "{}",
            f.error.message()
        );
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
        assert_eq!(
            param_of(r#"{"model":"m","input":"x","user":7}"#),
            Some("user")
        );
        assert_eq!(param_of(r#"{"model":["m"],"input":"x"}"#), Some("model"));
        assert_eq!(param_of(r#"[1]"#), None);
        assert_eq!(param_of(r#"{"model""#), None);
    }
}
