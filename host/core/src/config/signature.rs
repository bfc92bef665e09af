//! What a validated config becomes: its [`ModelSpec`] and typed [`Signature`].

use std::sync::Arc;

use super::*;

/// A config [`validate`] accepted, with what it holds as untyped JSON parsed once: the loader,
/// the scheduler and the sequence batcher read these, and none re-parses the config or needs a
/// "cannot happen" fallback. The config itself stays as written (normalized) for `/config`.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The normalized, validated config.
    pub config: Arc<ModelConfig>,
    /// `ensemble_scheduling.step` in the config's order, checked to form a DAG (empty unless
    /// the model is an ensemble).
    pub steps: Arc<[ensemble::EnsembleStep]>,
    /// `sequence_batching`, when set.
    pub sequence: Option<sequence::SequenceBatching>,
    /// The parameters Wisp reads (`wasm.*`, `openai.*`, `sla.*`), typed.
    pub params: Arc<params::Params>,
    /// The inputs and outputs, each with its datatype known, and how the model batches:
    /// what requests are checked against and backends are loaded with.
    pub signature: Arc<Signature>,
    /// The SHA-256 the model file must have when a backend reads it: its signed manifest's,
    /// set for a version loaded under `--model-verify-key`. A backend that reads the file
    /// checks the bytes it read against it and loads from those bytes, so that a file swapped
    /// after the signature check is refused instead of served.
    pub file_sha256: Option<[u8; 32]>,
}

/// An input or output of a validated model: its `input[]`/`output[]` entry with the datatype
/// known.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Shape without the batch dim; -1 = variable.
    pub dims: Vec<i64>,
    /// The shape the backend sees (without the batch dim), when the config reshapes it.
    pub reshape: Option<Vec<i64>>,
    /// The input may be omitted (never set on an output).
    pub optional: bool,
}

/// A validated model's signature: its tensors, typed, and its batching. [`validate`] builds
/// it, so no reader of a loaded model meets an unset datatype.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    /// The model's name (for messages).
    pub model: String,
    /// `max_batch_size`; 0 when the model has no batch dimension.
    pub max_batch_size: u32,
    /// `input[]`, in config order.
    pub inputs: Vec<TensorSpec>,
    /// `output[]`, in config order.
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// The signature `cfg` declares. An input or output without a datatype, or a negative
    /// `max_batch_size`, is refused. [`validate`] builds one for every model it accepts; a tool
    /// that runs a model outside a repository (`wisp plugin run`) builds its own.
    pub fn of(cfg: &ModelConfig) -> std::result::Result<Signature, ConfigError> {
        let tensor = |path: String,
                      name: &str,
                      datatype: Option<DataType>,
                      dims: &[i64],
                      reshape: Option<&Reshape>,
                      optional: bool| {
            Ok(TensorSpec {
                name: name.to_string(),
                datatype: datatype.ok_or_else(|| ConfigError {
                    path: format!("{path} '{name}'.data_type"),
                    message: "must be a valid type such as TYPE_FP32, got none".into(),
                })?,
                dims: dims.to_vec(),
                reshape: reshape.map(|r| r.shape.clone()),
                optional,
            })
        };
        let inputs = cfg.input.iter().enumerate().map(|(i, t)| {
            let p = format!("input[{i}]");
            tensor(
                p,
                &t.name,
                t.data_type,
                &t.dims,
                t.reshape.as_ref(),
                t.optional,
            )
        });
        let outputs = cfg.output.iter().enumerate().map(|(i, t)| {
            let p = format!("output[{i}]");
            tensor(p, &t.name, t.data_type, &t.dims, t.reshape.as_ref(), false)
        });
        Ok(Signature {
            model: cfg.name.clone(),
            max_batch_size: u32::try_from(cfg.max_batch_size).map_err(|_| ConfigError {
                path: "max_batch_size".into(),
                message: format!("must not be negative, got {}", cfg.max_batch_size),
            })?,
            inputs: inputs.collect::<std::result::Result<_, _>>()?,
            outputs: outputs.collect::<std::result::Result<_, _>>()?,
        })
    }

    /// The model has an implicit batch dimension.
    pub fn batches(&self) -> bool {
        self.max_batch_size > 0
    }

    /// The input named `name`.
    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|t| t.name == name)
    }

    /// The output named `name`.
    pub fn output(&self, name: &str) -> Option<&TensorSpec> {
        self.outputs.iter().find(|t| t.name == name)
    }

    /// The inputs' names, comma-separated (for messages).
    pub fn input_names(&self) -> String {
        names(&self.inputs)
    }

    /// The outputs' names, comma-separated (for messages).
    pub fn output_names(&self) -> String {
        names(&self.outputs)
    }
}

fn names(ts: &[TensorSpec]) -> String {
    ts.iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
