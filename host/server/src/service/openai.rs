//! The OpenAI-compatible embeddings API, protocol-neutral: which served models it exposes, and
//! how a list of texts becomes inference requests and comes back as vectors and token counts.
//! [`crate::http::openai`] is its codec (`POST /v1/embeddings`, `GET /v1/models`).
//!
//! Nothing here knows a particular model. A model joins the API through its config's
//! parameters:
//!
//! | parameter | meaning |
//! |---|---|
//! | `openai.api` | `embeddings`: serve this model on `/v1/embeddings` (required) |
//! | `openai.input` | the BYTES input that takes one text per batch row (default: the only input) |
//! | `openai.output` | the FP32 output holding one vector per row (default: the only FP32 output) |
//! | `openai.usage` | an integer output holding each row's token count (default: none; usage 0) |
//! | `openai.dimensions` | `fixed` (default: `dimensions` must equal the model's) or `truncate` (fewer dimensions by truncating and re-normalizing, for Matryoshka-trained models) |
//! | `openai.max_inputs` | texts per API request at most (default and limit 2048, OpenAI's) |
//!
//! A request's texts go to the model in chunks of its `max_batch_size` rows, all queued at
//! once, through [`Service::infer`]: validation, statistics, metrics and tracing are the same as
//! for any inference.

use std::sync::Arc;
use std::time::Instant;

use wisp_core::config::ModelConfig;
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, Result, Tensor};

use super::infer::{Decoded, OutputSpec};
use super::Service;
use crate::models::{ModelVersion, VersionState};

/// The most texts one API request may carry (OpenAI's own limit).
pub const MAX_INPUTS: usize = 2048;

/// How a model's vectors may be shortened on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimensions {
    /// Only the model's own size.
    Fixed,
    /// Any size from 1 up: the first N values, scaled back to unit length.
    Truncate,
}

/// How one model maps onto the embeddings API (read from its config's `openai.*` parameters).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingApi {
    /// The input that takes the texts.
    pub input: String,
    /// The output with the vectors.
    pub output: String,
    /// The output with each text's token count, if any.
    pub usage: Option<String>,
    /// The vector size.
    pub size: usize,
    /// Whether clients may ask for fewer dimensions.
    pub dimensions: Dimensions,
    /// Texts per request at most.
    pub max_inputs: usize,
}

impl EmbeddingApi {
    /// The model's mapping: `Ok(None)` when it does not join the API, an error naming the
    /// parameter when its `openai.*` parameters do not fit its signature.
    pub fn of(cfg: &ModelConfig) -> Result<Option<EmbeddingApi>> {
        let param = |key: &str| cfg.parameter_set(key);
        match param("openai.api") {
            None => return Ok(None),
            Some("embeddings") => {}
            Some(other) => {
                return Err(Error::invalid(format!(
                    "model '{}': parameter 'openai.api' must be 'embeddings', not '{other}'",
                    cfg.name
                )))
            }
        }
        let bad = |key: &str, why: String| {
            Error::invalid(format!("model '{}': parameter '{key}' {why}", cfg.name))
        };
        let input = match param("openai.input") {
            Some(name) => cfg
                .input
                .iter()
                .find(|i| i.name == name)
                .ok_or_else(|| bad("openai.input", format!("names no input: '{name}'")))?,
            None => match cfg.input.as_slice() {
                [only] => only,
                _ => {
                    return Err(bad(
                        "openai.input",
                        "is needed: the model has more than one input".into(),
                    ))
                }
            },
        };
        if input.data_type != Some(DataType::Bytes) || !matches!(input.dims[..], [1] | [-1]) {
            return Err(bad(
                "openai.input",
                format!(
                    "must name a TYPE_STRING input of dims [1]: '{}'",
                    input.name
                ),
            ));
        }
        let output = match param("openai.output") {
            Some(name) => cfg
                .output
                .iter()
                .find(|o| o.name == name)
                .ok_or_else(|| bad("openai.output", format!("names no output: '{name}'")))?,
            None => {
                let mut fp32 = cfg
                    .output
                    .iter()
                    .filter(|o| o.data_type == Some(DataType::Fp32));
                match (fp32.next(), fp32.next()) {
                    (Some(only), None) => only,
                    _ => {
                        return Err(bad(
                            "openai.output",
                            "is needed: the model has no single FP32 output".into(),
                        ))
                    }
                }
            }
        };
        let size = match output.dims[..] {
            [n] if output.data_type == Some(DataType::Fp32) && n > 0 => n as usize,
            _ => {
                return Err(bad(
                    "openai.output",
                    format!(
                        "must name a TYPE_FP32 output of fixed dims [N]: '{}'",
                        output.name
                    ),
                ))
            }
        };
        let usage = match param("openai.usage") {
            None => None,
            Some(name) => {
                let o = cfg
                    .output
                    .iter()
                    .find(|o| o.name == name)
                    .ok_or_else(|| bad("openai.usage", format!("names no output: '{name}'")))?;
                let integer = matches!(o.data_type, Some(DataType::Int32 | DataType::Int64));
                if !integer || !matches!(o.dims[..], [1] | [-1]) {
                    return Err(bad(
                        "openai.usage",
                        format!("must name a TYPE_INT32/64 output of dims [1]: '{name}'"),
                    ));
                }
                Some(o.name.clone())
            }
        };
        let dimensions = match param("openai.dimensions") {
            None | Some("fixed") => Dimensions::Fixed,
            Some("truncate") => Dimensions::Truncate,
            Some(other) => {
                return Err(bad(
                    "openai.dimensions",
                    format!("must be 'fixed' or 'truncate', not '{other}'"),
                ))
            }
        };
        let max_inputs = match param("openai.max_inputs") {
            None => MAX_INPUTS,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_INPUTS).contains(n))
                .ok_or_else(|| {
                    bad(
                        "openai.max_inputs",
                        format!("must be 1 to {MAX_INPUTS}, not '{v}'"),
                    )
                })?,
        };
        Ok(Some(EmbeddingApi {
            input: input.name.clone(),
            output: output.name.clone(),
            usage,
            size,
            dimensions,
            max_inputs,
        }))
    }
}

/// A failure of the embeddings API: the error, and the request field it concerns.
#[derive(Debug)]
pub struct ApiFailure {
    /// What went wrong (its kind gives the status).
    pub error: Error,
    /// The request field at fault (OpenAI's `param`), if one is.
    pub param: Option<&'static str>,
    /// OpenAI's machine-readable `code`, where it has one for the case.
    pub code: Option<&'static str>,
}

impl From<Error> for ApiFailure {
    fn from(error: Error) -> Self {
        ApiFailure {
            error,
            param: None,
            code: None,
        }
    }
}

impl ApiFailure {
    /// An invalid value of request field `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        ApiFailure {
            error: Error::invalid(message),
            param: Some(param),
            code: None,
        }
    }
}

/// A model the API serves, as `GET /v1/models` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiModel {
    /// The model's name (its `id`).
    pub id: String,
    /// When its serving version became ready, in seconds since the Unix epoch.
    pub created: u64,
}

/// What an embeddings request produced.
#[derive(Debug)]
pub struct Embeddings {
    /// The model that served it.
    pub model: String,
    /// One vector per input text, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens over all texts (0 when the model reports none).
    pub prompt_tokens: u64,
}

impl Service {
    /// The ready models that join the embeddings API, by name.
    pub fn api_models(&self) -> Vec<ApiModel> {
        let mut out = Vec::new();
        for (name, entry) in self.registry.models() {
            let ready = entry.versions.values().filter_map(|s| match s {
                VersionState::Ready(m) => Some(m),
                _ => None,
            });
            if let Some(m) = ready.max_by_key(|m| m.version) {
                if matches!(EmbeddingApi::of(&m.config), Ok(Some(_))) {
                    out.push(ApiModel {
                        id: name.clone(),
                        created: unix_secs(m.loaded_at),
                    });
                }
            }
        }
        out
    }

    /// One model of [`Service::api_models`], or OpenAI's not-found error.
    pub fn api_model(&self, id: &str) -> std::result::Result<ApiModel, ApiFailure> {
        let (m, _) = self.api_version(id)?;
        Ok(ApiModel {
            id: m.name.clone(),
            created: unix_secs(m.loaded_at),
        })
    }

    fn api_version(
        &self,
        id: &str,
    ) -> std::result::Result<(Arc<ModelVersion>, EmbeddingApi), ApiFailure> {
        let not_found = || ApiFailure {
            error: Error::not_found(format!(
                "The model `{id}` does not exist or is not served on this API."
            )),
            param: Some("model"),
            code: Some("model_not_found"),
        };
        let m = match self.registry.get(id, None) {
            Ok(m) => m,
            Err(e) if e.kind() == wisp_core::ErrorKind::NotFound => return Err(not_found()),
            Err(e) => return Err(e.into()),
        };
        match EmbeddingApi::of(&m.config)? {
            Some(api) => Ok((m, api)),
            None => Err(not_found()),
        }
    }

    /// Embeds `texts` with model `id`; `dimensions` shortens the vectors where the model
    /// allows it. Every text goes through the model's own pipeline (tokenizer, encoder,
    /// pooling), in chunks of its batch size queued together.
    pub async fn embed(
        &self,
        id: &str,
        texts: Vec<String>,
        dimensions: Option<u64>,
        received: Instant,
        trace_parent: Option<wisp_core::trace::TraceParent>,
    ) -> std::result::Result<Embeddings, ApiFailure> {
        let (m, api) = self.api_version(id)?;
        let fail = |f: ApiFailure| {
            m.stats()
                .record_failure(wisp_scheduler::FailReason::Other, received.elapsed());
            f
        };
        if texts.is_empty() {
            return Err(fail(ApiFailure::invalid(
                "input",
                "'input' must hold at least one text",
            )));
        }
        if texts.len() > api.max_inputs {
            return Err(fail(ApiFailure::invalid(
                "input",
                format!(
                    "'input' holds {} texts; model '{id}' takes at most {} per request",
                    texts.len(),
                    api.max_inputs
                ),
            )));
        }
        if let Some(i) = texts.iter().position(|t| t.is_empty()) {
            return Err(fail(ApiFailure::invalid(
                "input",
                format!("'input' text {i} is empty: every text needs at least one character"),
            )));
        }
        let keep = match dimensions {
            None => api.size,
            Some(d) if d as usize == api.size => api.size,
            Some(d)
                if api.dimensions == Dimensions::Truncate && d >= 1 && (d as usize) < api.size =>
            {
                d as usize
            }
            Some(d) => {
                let why = match api.dimensions {
                    Dimensions::Fixed => format!(
                        "model '{id}' does not support specifying dimensions other than its own ({})",
                        api.size
                    ),
                    Dimensions::Truncate => {
                        format!("'dimensions' must be 1 to {}, not {d}", api.size)
                    }
                };
                return Err(fail(ApiFailure::invalid("dimensions", why)));
            }
        };
        let chunk = if m.config.batches() {
            (m.config.max_batch_size.max(1)) as usize
        } else {
            1
        };
        let calls = texts.chunks(chunk).map(|part| {
            let request = self.embedding_request(&m, &api, part);
            let m = m.clone();
            async move { self.infer(m, request, received, trace_parent).await }
        });
        let answers = futures_util::future::try_join_all(calls).await?;
        let mut vectors = Vec::with_capacity(texts.len());
        let mut prompt_tokens = 0u64;
        for answer in answers {
            for (spec, t) in &answer.outputs {
                if spec.name == api.output {
                    for row in t.data.chunks_exact(api.size * 4) {
                        let mut v: Vec<f32> = row
                            .chunks_exact(4)
                            .take(keep)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect();
                        if keep < api.size {
                            normalize(&mut v);
                        }
                        vectors.push(v);
                    }
                } else if Some(&spec.name) == api.usage.as_ref() {
                    prompt_tokens = prompt_tokens.saturating_add(token_sum(t));
                }
            }
        }
        if vectors.len() != texts.len() {
            return Err(Error::internal(format!(
                "model '{id}' returned {} vectors for {} texts",
                vectors.len(),
                texts.len()
            ))
            .into());
        }
        Ok(Embeddings {
            model: m.name.clone(),
            vectors,
            prompt_tokens,
        })
    }

    /// The inference request for one chunk of texts: `[n, 1]` BYTES (`[n]` without batching
    /// is not possible: one text per request then), asking for the vector and usage outputs.
    fn embedding_request(
        &self,
        m: &ModelVersion,
        api: &EmbeddingApi,
        texts: &[String],
    ) -> Result<Decoded> {
        let n = texts.len() as i64;
        let shape = if m.config.batches() {
            vec![n, 1]
        } else {
            vec![1]
        };
        let data = encode_bytes_elements(texts.iter().map(|t| t.as_bytes()));
        let input = Tensor::new(api.input.clone(), DataType::Bytes, shape, data.into())?;
        let mut outputs = vec![OutputSpec {
            name: api.output.clone(),
            ..Default::default()
        }];
        if let Some(u) = &api.usage {
            outputs.push(OutputSpec {
                name: u.clone(),
                ..Default::default()
            });
        }
        Ok(Decoded {
            request: InferRequest {
                inputs: vec![input],
                requested_outputs: outputs.iter().map(|o| o.name.clone()).collect(),
                ..Default::default()
            },
            outputs,
            binary_default: false,
            shm_inputs: Vec::new(),
        })
    }
}

/// Scales `v` to unit L2 length (a zero vector stays zero).
fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The sum of an INT32/INT64 tensor's (non-negative) elements.
fn token_sum(t: &Tensor) -> u64 {
    match t.datatype {
        DataType::Int64 => t
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")).max(0) as u64)
            .fold(0, u64::saturating_add),
        DataType::Int32 => t
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")).max(0) as u64)
            .fold(0, u64::saturating_add),
        _ => 0,
    }
}

fn unix_secs(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_core::config::parse_pbtxt;

    fn config(extra: &str) -> ModelConfig {
        parse_pbtxt(
            "e",
            &format!(
                r#"name: "e" platform: "ensemble" max_batch_size: 8
            input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
            output [ {{ name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] }},
                     {{ name: "TOKENS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
            {extra}"#
            ),
        )
        .unwrap()
    }

    fn param(key: &str, value: &str) -> String {
        format!(r#"parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}"#)
    }

    #[test]
    fn models_join_only_when_asked() {
        assert_eq!(EmbeddingApi::of(&config("")).unwrap(), None);
        let api = EmbeddingApi::of(&config(&param("openai.api", "embeddings")))
            .unwrap()
            .unwrap();
        assert_eq!(
            (api.input.as_str(), api.output.as_str()),
            ("TEXT", "EMBEDDING")
        );
        assert_eq!(
            (api.size, api.usage, api.dimensions),
            (4, None, Dimensions::Fixed)
        );
        assert_eq!(api.max_inputs, MAX_INPUTS);
    }

    #[test]
    fn parameters_are_checked_against_the_signature() {
        let with = |pairs: &[(&str, &str)]| {
            let mut text = param("openai.api", "embeddings");
            for (k, v) in pairs {
                text += &param(k, v);
            }
            EmbeddingApi::of(&config(&text))
        };
        let api = with(&[
            ("openai.usage", "TOKENS"),
            ("openai.dimensions", "truncate"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(api.usage.as_deref(), Some("TOKENS"));
        assert_eq!(api.dimensions, Dimensions::Truncate);
        for (pairs, named) in [
            (vec![("openai.output", "TOKENS")], "openai.output"),
            (vec![("openai.output", "NOPE")], "openai.output"),
            (vec![("openai.usage", "EMBEDDING")], "openai.usage"),
            (vec![("openai.input", "EMBEDDING")], "openai.input"),
            (vec![("openai.dimensions", "any")], "openai.dimensions"),
            (vec![("openai.max_inputs", "0")], "openai.max_inputs"),
            (vec![("openai.max_inputs", "5000")], "openai.max_inputs"),
        ] {
            let e = with(&pairs).unwrap_err();
            assert!(e.message().contains(named), "{pairs:?}: {}", e.message());
        }
        let e = EmbeddingApi::of(&config(&param("openai.api", "chat"))).unwrap_err();
        assert!(e.message().contains("openai.api"), "{}", e.message());
    }

    #[test]
    fn truncated_vectors_are_renormalized() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0, 0.0];
        normalize(&mut zero);
        assert_eq!(zero, vec![0.0, 0.0]);
    }

    #[test]
    fn token_counts_sum() {
        let t = Tensor::new(
            "T",
            DataType::Int64,
            vec![3, 1],
            [4i64, 7, -1]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        )
        .unwrap();
        assert_eq!(token_sum(&t), 11);
    }
}
