//! Model configuration: `config.pbtxt` parsed, normalized, auto-completed and validated.
//!
//! The flow is Triton's: **parse** the protobuf text format against our own
//! `proto/model_config.proto` (so anything that is not valid Triton syntax is rejected with its
//! line and column), **auto-complete** missing inputs/outputs/`max_batch_size` from the model file
//! ([`autocomplete`]), **normalize** defaults ([`normalize`]), then **validate** everything and
//! report every error at once, each naming the model and the field path ([`validate`]).
//!
//! Fields that are valid Triton but that Wisp does not act on are kept (and echoed by the
//! `/config` endpoint) and listed by [`ModelConfig::unsupported_fields`] so the loader warns.

mod autocomplete;
mod check;
mod check_batching;
pub mod ensemble;
pub mod metrics;
pub mod params;
mod schema;
pub mod sequence;
mod signature;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use autocomplete::{autocomplete, check_model_filename, normalize, IoSpec, ModelIo};
pub use check::validate;
pub use schema::{config_from_json, config_to_json, config_to_protobuf};
pub use signature::{ModelSpec, Signature, TensorSpec};

use crate::datatype::DataType;
use crate::error::Error;

/// The platform name Triton uses for ONNX models.
pub const ONNX_PLATFORM: &str = "onnxruntime_onnx";
/// The backend name Triton uses for ONNX models.
pub const ONNX_BACKEND: &str = "onnxruntime";
/// The platform name of ensembles.
pub const ENSEMBLE_PLATFORM: &str = "ensemble";
/// Default instance count of an ensemble: batches of requests going through the pipeline at
/// once (its instances mostly wait on the composing models' schedulers).
pub const ENSEMBLE_DEFAULT_INSTANCES: i32 = 16;
/// The backend name of WebAssembly plugin models.
pub const WASM_BACKEND: &str = "wasm";
/// Default `max_batch_size` given to models that can batch but do not say (Triton's
/// `--backend-config=default-max-batch-size`).
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

/// The bound on every number a config may hold. A config can arrive over the network (a load
/// request's `config` parameter), so each number is checked against these before anything is
/// sized, counted or looped from it; [`validate`] reports a value past its bound with the field's
/// path.
pub mod bounds {
    /// `max_batch_size`.
    pub const MAX_BATCH_SIZE: i32 = 1 << 16;
    /// Number of `input` or of `output` entries.
    pub const MAX_TENSORS: usize = 1024;
    /// Rank of `dims` and `reshape.shape` (without the batch dim).
    pub const MAX_RANK: usize = 32;
    /// One dimension of `dims` or `reshape.shape`.
    pub const MAX_DIM: i64 = 1 << 32;
    /// Elements of one batch item when every dim is fixed.
    pub const MAX_ELEMENTS: i64 = 1 << 34;
    /// `instance_group[].count`, and the total over all groups.
    pub const MAX_INSTANCES: i32 = 256;
    /// `dynamic_batching.priority_levels`.
    pub const MAX_PRIORITY_LEVELS: u64 = 1024;
    /// `dynamic_batching.max_queue_delay_microseconds` (one minute).
    pub const MAX_QUEUE_DELAY_US: u64 = 60_000_000;
    /// `default_timeout_microseconds` of a queue policy (one hour).
    pub const MAX_TIMEOUT_US: u64 = 3_600_000_000;
    /// `max_queue_size` of a queue policy.
    pub const MAX_QUEUE_SIZE: u32 = 1 << 20;
    /// `model_warmup` samples.
    pub const MAX_WARMUP_SAMPLES: usize = 64;
    /// `model_warmup[].count`.
    pub const MAX_WARMUP_COUNT: u32 = 1000;
    /// Bytes of one warm-up input, batch included (BYTES elements count 4 bytes each).
    pub const MAX_WARMUP_BYTES: u64 = 256 << 20;
    /// `version_policy.latest.num_versions` and `version_policy.specific.versions` entries.
    pub const MAX_VERSIONS: u32 = 1024;
    /// `ensemble_scheduling.step` entries (the DAG check walks them recursively).
    pub const MAX_ENSEMBLE_STEPS: usize = 1024;
    /// Live sequences of one model version (`sequence_batching`), and
    /// `oldest.max_candidate_sequences`.
    pub const MAX_SEQUENCES: usize = 1 << 16;
    /// Bytes of one implicit state tensor of one sequence.
    pub const MAX_STATE_BYTES: u64 = 64 << 20;
    /// Bytes of implicit state all the live sequences of one model version may hold together:
    /// the slots are cut to fit (sequences past them wait for a slot, holding no state).
    pub const MAX_STATE_BYTES_TOTAL: u64 = 1 << 30;
}

/// The config field of a model's transaction policy (`decoupled`).
pub const TRANSACTION_POLICY: &str = "model_transaction_policy";

type Map = serde_json::Map<String, serde_json::Value>;

/// Triton's `ModelConfig`, for the fields Wisp acts on; the rest is kept in `other`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelConfig {
    /// Model name; must equal the model's directory name.
    pub name: String,
    /// Platform (`onnxruntime_onnx`, `ensemble`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub platform: String,
    /// Backend (`onnxruntime`, `wasm`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub backend: String,
    /// Which versions are served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_policy: Option<VersionPolicy>,
    /// 0: the model does not batch; ≥ 1: inputs and outputs carry an implicit batch dim.
    pub max_batch_size: i32,
    /// Whether the config's text or JSON set `max_batch_size` (0 included); when it did not,
    /// auto-complete may choose one. Not part of the config's JSON.
    #[serde(skip)]
    pub max_batch_size_set: bool,
    /// Inputs.
    pub input: Vec<ModelInput>,
    /// Outputs.
    pub output: Vec<ModelOutput>,
    /// Instance groups.
    pub instance_group: Vec<InstanceGroup>,
    /// File name of the model inside its version directory.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default_model_filename: String,
    /// Backend parameters (`key → {string_value}`).
    pub parameters: BTreeMap<String, ModelParameter>,
    /// Dynamic batching (absent: each request executes alone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
    /// Warm-up samples run on every instance before the version is READY.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub model_warmup: Vec<ModelWarmup>,
    /// Response cache switch (also needs `--cache-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_cache: Option<ResponseCache>,
    /// Every other Triton field that was set, verbatim (proto JSON form).
    #[serde(flatten)]
    pub other: Map,
}

/// `version_policy`: exactly one of the three is set after normalization.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct VersionPolicy {
    /// Serve the `num_versions` highest versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest: Option<Latest>,
    /// Serve every version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub all: Option<Map>,
    /// Serve the listed versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub specific: Option<Specific>,
}

/// `version_policy.latest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Latest {
    /// How many of the highest versions to serve (default 1).
    pub num_versions: u32,
}

/// `version_policy.specific`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Specific {
    /// The versions to serve.
    pub versions: Vec<i64>,
}

/// `input[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelInput {
    /// Tensor name.
    pub name: String,
    /// Element type (`TYPE_FP32` in the config); `None` while unset (`TYPE_INVALID`), which
    /// [`validate`] refuses, so a validated config always has one.
    #[serde(with = "config_type", skip_serializing_if = "Option::is_none")]
    pub data_type: Option<DataType>,
    /// `FORMAT_NONE`, `FORMAT_NHWC`, `FORMAT_NCHW`.
    pub format: TensorFormat,
    /// Shape without the batch dim; -1 = variable.
    pub dims: Vec<i64>,
    /// Shape the backend sees, if different from `dims`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reshape: Option<Reshape>,
    /// The input may be omitted.
    pub optional: bool,
    /// Other Triton input fields that were set.
    #[serde(flatten)]
    pub other: Map,
}

/// `output[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelOutput {
    /// Tensor name.
    pub name: String,
    /// Element type (`TYPE_FP32` in the config); `None` while unset, which [`validate`]
    /// refuses.
    #[serde(with = "config_type", skip_serializing_if = "Option::is_none")]
    pub data_type: Option<DataType>,
    /// Shape without the batch dim; -1 = variable.
    pub dims: Vec<i64>,
    /// Shape the backend produces, if different from `dims`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reshape: Option<Reshape>,
    /// Labels file beside `config.pbtxt`, for the classification extension.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub label_filename: String,
    /// Other Triton output fields that were set.
    #[serde(flatten)]
    pub other: Map,
}

/// `reshape { shape: [...] }`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Reshape {
    /// The shape.
    pub shape: Vec<i64>,
}

/// `input[].format`: the layout of an image input, for clients that ask.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum TensorFormat {
    /// `FORMAT_NONE`: no layout implied.
    #[default]
    #[serde(rename = "FORMAT_NONE")]
    None,
    /// `FORMAT_NHWC`: height, width, channels (3 dims without the batch dim).
    #[serde(rename = "FORMAT_NHWC")]
    Nhwc,
    /// `FORMAT_NCHW`: channels, height, width (3 dims without the batch dim).
    #[serde(rename = "FORMAT_NCHW")]
    Nchw,
}

impl TensorFormat {
    /// The config name (`FORMAT_NHWC`).
    pub fn as_str(self) -> &'static str {
        match self {
            TensorFormat::None => "FORMAT_NONE",
            TensorFormat::Nhwc => "FORMAT_NHWC",
            TensorFormat::Nchw => "FORMAT_NCHW",
        }
    }
}

/// (De)serializes an element type by its config name (`TYPE_FP32`, `TYPE_STRING` for BYTES).
/// `TYPE_INVALID`, the schema's zero value, is `None`; the schema admits no other name.
mod config_type {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::datatype::DataType;

    pub fn serialize<S: Serializer>(v: &Option<DataType>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.map_or("TYPE_INVALID", DataType::config_name))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DataType>, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        match &*name {
            "" | "TYPE_INVALID" => Ok(None),
            n => DataType::from_config_name(n).map(Some).ok_or_else(|| {
                serde::de::Error::custom(format!("'{n}' is not a data type such as TYPE_FP32"))
            }),
        }
    }
}

/// `instance_group[].kind`: Triton's names, which the schema alone admits.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum InstanceKind {
    /// `KIND_AUTO`: normalized to `KIND_CPU`.
    #[default]
    #[serde(rename = "KIND_AUTO")]
    Auto,
    /// `KIND_GPU`: refused by validation.
    #[serde(rename = "KIND_GPU")]
    Gpu,
    /// `KIND_CPU`.
    #[serde(rename = "KIND_CPU")]
    Cpu,
    /// `KIND_MODEL`: the model places itself.
    #[serde(rename = "KIND_MODEL")]
    Model,
}

/// `ModelQueuePolicy.timeout_action`: what happens to a request whose queue timeout expires.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum TimeoutAction {
    /// `REJECT`: fail it with "Request timeout expired".
    #[default]
    #[serde(rename = "REJECT")]
    Reject,
    /// `DELAY`: serve it after every request of the same or higher priority still in time.
    #[serde(rename = "DELAY")]
    Delay,
}

/// `instance_group[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct InstanceGroup {
    /// Group name (default `<model>_<index>`... normalized to the model name as Triton does).
    pub name: String,
    /// Where the instances run (`KIND_GPU` is rejected: Wisp runs on CPU).
    pub kind: InstanceKind,
    /// Number of instances.
    pub count: i32,
    /// Host policy name (`--host-policy`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host_policy: String,
    /// Other Triton group fields that were set.
    #[serde(flatten)]
    pub other: Map,
}

/// `parameters { key: ..., value: { string_value: ... } }`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelParameter {
    /// The value.
    pub string_value: String,
}

/// `dynamic_batching { ... }`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DynamicBatching {
    /// Batch sizes sent as soon as they can be formed.
    pub preferred_batch_size: Vec<i32>,
    /// How long the oldest request may wait for a batch to fill (default 0).
    pub max_queue_delay_microseconds: u64,
    /// Deliver responses in request order.
    pub preserve_ordering: bool,
    /// Number of priority levels (1 is the highest); 0 means one level.
    pub priority_levels: u64,
    /// Level of requests that do not give one.
    pub default_priority_level: u64,
    /// Queue policy of every level without its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_queue_policy: Option<QueuePolicy>,
    /// Queue policy per level.
    pub priority_queue_policy: BTreeMap<u64, QueuePolicy>,
}

/// `ModelQueuePolicy`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct QueuePolicy {
    /// `REJECT` (default) or `DELAY`.
    pub timeout_action: TimeoutAction,
    /// Default timeout in µs (0 = none).
    pub default_timeout_microseconds: u64,
    /// A request may lower (never raise) the timeout with its `timeout` parameter.
    pub allow_timeout_override: bool,
    /// Queue bound (0 = unbounded); a full queue rejects at once.
    pub max_queue_size: u32,
}

/// `model_warmup [ ... ]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ModelWarmup {
    /// Sample name.
    pub name: String,
    /// Batch size of the sample (>= 1; 1 for models that do not batch).
    pub batch_size: u32,
    /// Per input: how to make its data.
    pub inputs: BTreeMap<String, WarmupInput>,
    /// Executions of this sample (0 means 1).
    pub count: u32,
}

/// `model_warmup.inputs` value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct WarmupInput {
    /// Element type; `None` takes the declared input's.
    #[serde(with = "config_type", skip_serializing_if = "Option::is_none")]
    pub data_type: Option<DataType>,
    /// Shape without the batch dim.
    pub dims: Vec<i64>,
    /// Zeros.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_data: Option<bool>,
    /// Random data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_data: Option<bool>,
    /// File in the model's `warmup/` directory with the raw row-major data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_data_file: Option<String>,
}

/// `response_cache { enable: true }`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ResponseCache {
    /// Cache this model's successful responses.
    pub enable: bool,
}

/// One problem in a model's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path (`input[0].dims`), empty for the whole file.
    pub path: String,
    /// What is wrong and what was expected.
    pub message: String,
}

/// Every problem found in one model's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The model.
    pub model: String,
    /// The problems, in field order.
    pub errors: Vec<ConfigError>,
}

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid config for model '{}': ", self.model)?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            if e.path.is_empty() {
                write!(f, "{}", e.message)?;
            } else {
                write!(f, "{}: {}", e.path, e.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigErrors> for Error {
    fn from(e: ConfigErrors) -> Self {
        Error::invalid(e.to_string())
    }
}

impl ModelConfig {
    /// The ONNX backend serves this model.
    pub fn is_onnx(&self) -> bool {
        self.platform == ONNX_PLATFORM || self.backend == ONNX_BACKEND
    }

    /// A WebAssembly component (`backend: "wasm"`) serves this model.
    pub fn is_wasm(&self) -> bool {
        self.backend == WASM_BACKEND
    }

    /// Whether `model_transaction_policy { decoupled: true }` is set: the model sends zero or
    /// more responses per request (a wasm plugin through `wisp:plugin/responses`).
    pub fn decoupled(&self) -> bool {
        self.other
            .get(TRANSACTION_POLICY)
            .and_then(|p| p.get("decoupled"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }

    /// An ensemble (`platform: "ensemble"`).
    pub fn is_ensemble(&self) -> bool {
        self.platform == ENSEMBLE_PLATFORM
    }

    /// The model has an implicit batch dimension.
    pub fn batches(&self) -> bool {
        self.max_batch_size > 0
    }

    /// A backend parameter's string value.
    pub fn parameter(&self, key: &str) -> Option<&str> {
        self.parameters.get(key).map(|p| p.string_value.as_str())
    }

    /// Sets parameter `key` to `value` (`parameters { key: … value: { string_value: … } }`).
    pub fn set_parameter(&mut self, key: &str, value: &str) {
        self.parameters.insert(
            key.to_string(),
            ModelParameter {
                string_value: value.to_string(),
            },
        );
    }

    /// A parameter's value trimmed, `None` when it is absent or blank (blank means unset).
    pub fn parameter_set(&self, key: &str) -> Option<&str> {
        self.parameter(key).map(str::trim).filter(|v| !v.is_empty())
    }

    /// Top-level Triton fields that are set but that Wisp does not act on.
    pub fn unsupported_fields(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .other
            .keys()
            .filter(|k| !(self.is_ensemble() && *k == "ensemble_scheduling"))
            .filter(|k| *k != sequence::FIELD && *k != TRANSACTION_POLICY)
            .cloned()
            .collect();
        for (i, input) in self.input.iter().enumerate() {
            out.extend(input.other.keys().map(|k| format!("input[{i}].{k}")));
        }
        for (i, output) in self.output.iter().enumerate() {
            out.extend(output.other.keys().map(|k| format!("output[{i}].{k}")));
        }
        for (i, g) in self.instance_group.iter().enumerate() {
            // rate_limiter is acted on under --rate-limit (and ignored without it, as in Triton)
            out.extend(
                g.other
                    .keys()
                    .filter(|k| *k != "rate_limiter")
                    .map(|k| format!("instance_group[{i}].{k}")),
            );
        }
        out
    }

    /// Total instance count over all groups.
    pub fn instance_count(&self) -> usize {
        // (normalize() guarantees at least one group with count >= 1)
        self.instance_group
            .iter()
            .map(|g| g.count.max(0) as usize)
            .sum()
    }
}

/// Parses `config.pbtxt` text. `model` names the model in errors.
pub fn parse_pbtxt(model: &str, text: &str) -> Result<ModelConfig, ConfigErrors> {
    schema::parse_text(text).map_err(|message| ConfigErrors {
        model: model.to_string(),
        errors: vec![ConfigError {
            path: String::new(),
            message,
        }],
    })
}

/// Reads a labels file: one label per line.
pub fn read_labels(path: &Path) -> std::io::Result<Vec<String>> {
    Ok(
        crate::repository::read_regular_text(path, crate::repository::MAX_SMALL_FILE_BYTES)?
            .lines()
            .map(|l| l.trim_end_matches('\r').to_string())
            .collect(),
    )
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod fuzz;
