//! Protocol-neutral inference requests and responses, shared by every front end and backend.

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
}
