//! The OpenAI-compatible embeddings API, protocol-neutral: which served models it exposes, and
//! how a list of texts becomes inference requests and comes back as vectors and token counts.
//! `wisp_server::http::openai` is its codec (`POST /v1/embeddings`, `GET /v1/models`).
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

use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, InferRequest, Result, Tensor};

use super::infer::{Decoded, OutputSpec};
use super::Service;
use crate::models::{ModelVersion, VersionState};

pub use wisp_core::config::params::{Dimensions, EmbeddingApi, MAX_EMBEDDING_INPUTS as MAX_INPUTS};

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
                if m.params.embeddings.is_some() {
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
    ) -> std::result::Result<(Arc<ModelVersion>, Arc<EmbeddingApi>), ApiFailure> {
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
        // Read and checked with the config, when the model loaded.
        match m.params.embeddings.clone() {
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
            shm_scope: Default::default(),
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
