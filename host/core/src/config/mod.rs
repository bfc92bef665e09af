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

pub mod ensemble;
pub mod params;
mod schema;
pub mod sequence;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use schema::{config_from_json, config_to_json, config_to_protobuf};

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
            .filter(|k| *k != sequence::FIELD)
            .cloned()
            .collect();
        for (i, input) in self.input.iter().enumerate() {
            out.extend(input.other.keys().map(|k| format!("input[{i}].{k}")));
        }
        for (i, output) in self.output.iter().enumerate() {
            out.extend(output.other.keys().map(|k| format!("output[{i}].{k}")));
        }
        for (i, g) in self.instance_group.iter().enumerate() {
            out.extend(g.other.keys().map(|k| format!("instance_group[{i}].{k}")));
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

/// A model file's own description of one tensor, for auto-complete.
#[derive(Debug, Clone, PartialEq)]
pub struct IoSpec {
    /// Tensor name.
    pub name: String,
    /// Element type, `None` if the model file uses one Wisp does not serve.
    pub datatype: Option<DataType>,
    /// Full shape as in the model file (-1 for symbolic dims).
    pub shape: Vec<i64>,
}

/// The inputs and outputs a model file declares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelIo {
    /// Inputs (initializers excluded).
    pub inputs: Vec<IoSpec>,
    /// Outputs.
    pub outputs: Vec<IoSpec>,
    /// The max batch size the model file declares (a plugin's `describe`); `None` when it
    /// declares none (ONNX: inferred from the shapes).
    pub max_batch_size: Option<u32>,
}

/// Fills in what the config leaves out from the model file, as Triton's ONNX backend does:
/// `max_batch_size` (when the config did not set it and every tensor's first dim is variable),
/// missing inputs and outputs, and missing `data_type`/`dims` of listed ones.
pub fn autocomplete(cfg: &mut ModelConfig, io: &ModelIo) {
    let all = io.inputs.iter().chain(io.outputs.iter());
    let can_batch = !io.inputs.is_empty() && all.clone().all(|t| t.shape.first() == Some(&-1));
    if let Some(m) = io.max_batch_size.filter(|_| !cfg.max_batch_size_set) {
        cfg.max_batch_size = i32::try_from(m).unwrap_or(i32::MAX);
        cfg.max_batch_size_set = true;
    }
    if !cfg.max_batch_size_set && cfg.max_batch_size == 0 && can_batch {
        // As Triton: a default max batch size > 1 also turns the dynamic batcher on.
        cfg.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
        if cfg.dynamic_batching.is_none() && !cfg.other.contains_key("sequence_batching") {
            cfg.dynamic_batching = Some(DynamicBatching::default());
        }
    }
    let strip = cfg.max_batch_size > 0;
    let dims_of = |t: &IoSpec| -> Vec<i64> {
        if strip && !t.shape.is_empty() {
            t.shape[1..].to_vec()
        } else {
            t.shape.clone()
        }
    };
    let type_of = |t: &IoSpec| t.datatype;
    // What the sequence batcher feeds and reads is not the client's to send or see.
    let reserved: Vec<String> = match sequence::read(cfg) {
        Ok(Some(seq)) => seq
            .controls
            .iter()
            .map(|c| c.name.clone())
            .chain(seq.states.iter().map(|s| s.input_name.clone()))
            .chain(seq.states.iter().map(|s| s.output_name.clone()))
            .collect(),
        _ => Vec::new(),
    };
    if cfg.input.is_empty() {
        cfg.input = io
            .inputs
            .iter()
            .filter(|t| !reserved.contains(&t.name))
            .map(|t| ModelInput {
                name: t.name.clone(),
                data_type: type_of(t),
                dims: dims_of(t),
                ..Default::default()
            })
            .collect();
    } else {
        for input in &mut cfg.input {
            if let Some(t) = io.inputs.iter().find(|t| t.name == input.name) {
                if input.data_type.is_none() {
                    input.data_type = type_of(t);
                }
                if input.dims.is_empty() && input.reshape.is_none() {
                    input.dims = dims_of(t);
                }
            }
        }
    }
    if cfg.output.is_empty() {
        cfg.output = io
            .outputs
            .iter()
            .filter(|t| !reserved.contains(&t.name))
            .map(|t| ModelOutput {
                name: t.name.clone(),
                data_type: type_of(t),
                dims: dims_of(t),
                ..Default::default()
            })
            .collect();
    } else {
        for output in &mut cfg.output {
            if let Some(t) = io.outputs.iter().find(|t| t.name == output.name) {
                if output.data_type.is_none() {
                    output.data_type = type_of(t);
                }
                if output.dims.is_empty() && output.reshape.is_none() {
                    output.dims = dims_of(t);
                }
            }
        }
    }
}

/// Fills defaults: name from the directory, ONNX backend when a `model.onnx` is present,
/// `version_policy { latest { num_versions: 1 } }`, one `KIND_CPU` instance group (two instances
/// for ONNX models, as Triton).
pub fn normalize(cfg: &mut ModelConfig, dir_name: &str, model_dir: &Path) {
    if cfg.name.is_empty() {
        cfg.name = dir_name.to_string();
    }
    if cfg.platform.is_empty() && cfg.backend.is_empty() {
        let has_onnx = std::fs::read_dir(model_dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("model.onnx").is_file());
        let has_wasm = || {
            std::fs::read_dir(model_dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().join("model.wasm").is_file())
        };
        if has_onnx {
            cfg.backend = ONNX_BACKEND.into();
        } else if has_wasm() {
            cfg.backend = WASM_BACKEND.into();
        }
    }
    if cfg.is_wasm() && cfg.default_model_filename.is_empty() {
        cfg.default_model_filename = "model.wasm".into();
    }
    if cfg.is_onnx() {
        if cfg.platform.is_empty() {
            cfg.platform = ONNX_PLATFORM.into();
        }
        if cfg.backend.is_empty() {
            cfg.backend = ONNX_BACKEND.into();
        }
        if cfg.default_model_filename.is_empty() {
            cfg.default_model_filename = "model.onnx".into();
        }
    }
    match &mut cfg.version_policy {
        None => {
            cfg.version_policy = Some(VersionPolicy {
                latest: Some(Latest { num_versions: 1 }),
                ..Default::default()
            })
        }
        Some(p) if p.latest.is_none() && p.all.is_none() && p.specific.is_none() => {
            p.latest = Some(Latest { num_versions: 1 })
        }
        _ => {}
    }
    if cfg.instance_group.is_empty() {
        cfg.instance_group.push(InstanceGroup::default());
    }
    let name = cfg.name.clone();
    let onnx = cfg.is_onnx();
    let ensemble = cfg.is_ensemble();
    for (i, g) in cfg.instance_group.iter_mut().enumerate() {
        if g.name.is_empty() {
            g.name = if i == 0 {
                name.clone()
            } else {
                format!("{name}_{i}")
            };
        }
        if g.kind == InstanceKind::Auto {
            g.kind = InstanceKind::Cpu;
        }
        if g.count == 0 {
            // Triton's default: two CPU instances for ONNX Runtime models, one otherwise.
            g.count = if onnx {
                2
            } else if ensemble {
                ENSEMBLE_DEFAULT_INSTANCES
            } else {
                1
            };
        }
    }
}

/// `default_model_filename` must be a plain file name: it is joined to each version directory,
/// and a config from the network must not point it anywhere else.
pub fn check_model_filename(file: &str, model_dir: &Path) -> Result<(), String> {
    if file.is_empty() {
        return Ok(());
    }
    crate::repository::confine(&model_dir.join("1"), file)?;
    if Path::new(file).components().count() != 1 {
        return Err(format!(
            "'{file}' must be a file name inside the version directory"
        ));
    }
    Ok(())
}

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

/// Checks a normalized config, reporting every problem found; a config that passes comes back
/// as its [`ModelSpec`].
pub fn validate(
    cfg: ModelConfig,
    dir_name: &str,
    model_dir: &Path,
) -> Result<ModelSpec, ConfigErrors> {
    let (steps, sequence, params, signature) = check(&cfg, dir_name, model_dir)?;
    Ok(ModelSpec {
        config: Arc::new(cfg),
        steps: steps.into(),
        sequence,
        params: Arc::new(params),
        signature: Arc::new(signature),
        file_sha256: None,
    })
}

type Checked = (
    Vec<ensemble::EnsembleStep>,
    Option<sequence::SequenceBatching>,
    params::Params,
    Signature,
);

fn check(cfg: &ModelConfig, dir_name: &str, model_dir: &Path) -> Result<Checked, ConfigErrors> {
    let mut steps = Vec::new();
    let mut errs = Vec::new();
    let mut err = |path: String, message: String| errs.push(ConfigError { path, message });

    if cfg.name != dir_name {
        err(
            "name".into(),
            format!(
                "'{}' does not match the model directory name '{dir_name}'",
                cfg.name
            ),
        );
    }
    let wasm = cfg.is_wasm() && cfg.platform.is_empty();
    let ensemble = cfg.is_ensemble() && cfg.backend.is_empty();
    if ensemble && !cfg.other.contains_key(ensemble::FIELD) {
        err(
            ensemble::FIELD.into(),
            "an ensemble needs ensemble_scheduling { step [ ... ] }".into(),
        );
    } else if ensemble {
        // The steps and the DAG they form, with the config's other errors.
        let problems = match ensemble::steps(cfg) {
            Ok(read) => {
                let names = |io: &mut dyn Iterator<Item = &String>| io.cloned().collect::<Vec<_>>();
                steps = read;
                ensemble::check_dag(
                    &names(&mut cfg.input.iter().map(|i| &i.name)),
                    &names(&mut cfg.output.iter().map(|o| &o.name)),
                    &steps,
                )
            }
            Err(problems) => problems,
        };
        for p in problems {
            err(ensemble::FIELD.into(), p);
        }
    }
    let sequence = match sequence::read(cfg) {
        Ok(seq) => seq,
        Err(problems) => {
            for p in problems {
                err(sequence::FIELD.into(), p);
            }
            None
        }
    };
    if cfg.other.contains_key(sequence::FIELD) && ensemble {
        err(
            sequence::FIELD.into(),
            "an ensemble passes its sequence flags to its steps; it has no sequence batcher of its own".into(),
        );
    }
    if !(cfg.is_onnx() || wasm || ensemble) {
        let what = if cfg.platform.is_empty() && cfg.backend.is_empty() {
            "neither platform nor backend is set and no <version>/model.onnx or model.wasm was found".to_string()
        } else {
            format!(
                "unsupported platform '{}' / backend '{}', expected platform \"{ONNX_PLATFORM}\" or \"{ENSEMBLE_PLATFORM}\", or backend \"{ONNX_BACKEND}\" or \"{WASM_BACKEND}\"",
                cfg.platform, cfg.backend
            )
        };
        err("backend".into(), what);
    }
    if cfg.max_batch_size < 0 || cfg.max_batch_size > bounds::MAX_BATCH_SIZE {
        err(
            "max_batch_size".into(),
            format!(
                "must be in 0..={}, got {}",
                bounds::MAX_BATCH_SIZE,
                cfg.max_batch_size
            ),
        );
    }
    if let Err(why) = check_model_filename(&cfg.default_model_filename, model_dir) {
        err("default_model_filename".into(), why);
    }
    let mut param_errs = Vec::new();
    let params = params::read(cfg, model_dir, wasm, &mut param_errs);
    for e in param_errs {
        err(e.path, e.message);
    }
    if cfg.input.len() > bounds::MAX_TENSORS {
        err(
            "input".into(),
            format!(
                "at most {} inputs, got {}",
                bounds::MAX_TENSORS,
                cfg.input.len()
            ),
        );
    }
    if cfg.output.len() > bounds::MAX_TENSORS {
        err(
            "output".into(),
            format!(
                "at most {} outputs, got {}",
                bounds::MAX_TENSORS,
                cfg.output.len()
            ),
        );
    }
    if let Some(p) = &cfg.version_policy {
        if let Some(l) = &p.latest {
            if l.num_versions == 0 || l.num_versions > bounds::MAX_VERSIONS {
                err(
                    "version_policy.latest.num_versions".into(),
                    format!(
                        "must be in 1..={}, got {}",
                        bounds::MAX_VERSIONS,
                        l.num_versions
                    ),
                );
            }
        }
        if let Some(s) = &p.specific {
            if s.versions.is_empty() {
                err(
                    "version_policy.specific.versions".into(),
                    "must list at least one version".into(),
                );
            }
            if s.versions.len() > bounds::MAX_VERSIONS as usize {
                err(
                    "version_policy.specific.versions".into(),
                    format!("at most {} versions", bounds::MAX_VERSIONS),
                );
            }
            for v in &s.versions {
                if *v < 0 {
                    err(
                        "version_policy.specific.versions".into(),
                        format!("version {v} is negative"),
                    );
                }
            }
        }
    }
    if cfg.input.is_empty() {
        err(
            "input".into(),
            "the model has no inputs (none configured and none found in the model file)".into(),
        );
    }
    if cfg.output.is_empty() {
        err(
            "output".into(),
            "the model has no outputs (none configured and none found in the model file)".into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in cfg.input.iter().enumerate() {
        let p = format!("input[{i}]");
        check_tensor(
            &mut err,
            &p,
            &t.name,
            t.data_type,
            &t.dims,
            t.reshape.as_ref(),
        );
        if !seen.insert(t.name.as_str()) {
            err(format!("{p}.name"), format!("duplicate input '{}'", t.name));
        }
        if t.format != TensorFormat::None && t.dims.len() != 3 {
            err(
                format!("{p}.format"),
                format!(
                    "{} needs 3 dims (without the batch dim), got {:?}",
                    t.format.as_str(),
                    t.dims
                ),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in cfg.output.iter().enumerate() {
        let p = format!("output[{i}]");
        check_tensor(
            &mut err,
            &p,
            &t.name,
            t.data_type,
            &t.dims,
            t.reshape.as_ref(),
        );
        if !seen.insert(t.name.as_str()) {
            err(
                format!("{p}.name"),
                format!("duplicate output '{}'", t.name),
            );
        }
        if !t.label_filename.is_empty() {
            match crate::repository::confine(model_dir, &t.label_filename) {
                Err(why) => err(format!("{p}.label_filename"), why),
                Ok(path) if !path.is_file() => err(
                    format!("{p}.label_filename"),
                    format!(
                        "labels file '{}' not found beside config.pbtxt",
                        t.label_filename
                    ),
                ),
                Ok(_) => {}
            }
        }
    }
    for (i, g) in cfg.instance_group.iter().enumerate() {
        let p = format!("instance_group[{i}]");
        if g.kind == InstanceKind::Gpu {
            err(
                format!("{p}.kind"),
                "KIND_GPU is not supported: Wisp runs models on the CPU (use KIND_CPU)".into(),
            );
        }
        if g.count < 1 || g.count > bounds::MAX_INSTANCES {
            err(
                format!("{p}.count"),
                format!("must be in 1..={}, got {}", bounds::MAX_INSTANCES, g.count),
            );
        }
    }
    let total: i64 = cfg
        .instance_group
        .iter()
        .map(|g| g.count.max(0) as i64)
        .sum();
    if total > bounds::MAX_INSTANCES as i64 {
        err(
            "instance_group".into(),
            format!(
                "at most {} instances in all, got {total}",
                bounds::MAX_INSTANCES
            ),
        );
    }
    if let Some(db) = &cfg.dynamic_batching {
        if cfg.max_batch_size == 0 && !db.preferred_batch_size.is_empty() {
            err(
                "dynamic_batching.preferred_batch_size".into(),
                "needs max_batch_size >= 1".into(),
            );
        }
        for &p in &db.preferred_batch_size {
            if p < 1 || (cfg.max_batch_size > 0 && p > cfg.max_batch_size) {
                err(
                    "dynamic_batching.preferred_batch_size".into(),
                    format!("{p} is outside 1..={}", cfg.max_batch_size),
                );
            }
        }
        if db.priority_levels > bounds::MAX_PRIORITY_LEVELS {
            err(
                "dynamic_batching.priority_levels".into(),
                format!(
                    "must be in 0..={}, got {}",
                    bounds::MAX_PRIORITY_LEVELS,
                    db.priority_levels
                ),
            );
        }
        if db.max_queue_delay_microseconds > bounds::MAX_QUEUE_DELAY_US {
            err(
                "dynamic_batching.max_queue_delay_microseconds".into(),
                format!(
                    "must be at most {}, got {}",
                    bounds::MAX_QUEUE_DELAY_US,
                    db.max_queue_delay_microseconds
                ),
            );
        }
        let levels = db.priority_levels.clamp(1, bounds::MAX_PRIORITY_LEVELS);
        if db.priority_levels > 0
            && (db.default_priority_level < 1 || db.default_priority_level > levels)
        {
            err(
                "dynamic_batching.default_priority_level".into(),
                format!("must be in 1..={levels}, got {}", db.default_priority_level),
            );
        }
        let policies = db
            .default_queue_policy
            .iter()
            .map(|p| ("dynamic_batching.default_queue_policy".to_string(), p))
            .chain(
                db.priority_queue_policy
                    .iter()
                    .map(|(l, p)| (format!("dynamic_batching.priority_queue_policy[{l}]"), p)),
            );
        for (path, p) in policies {
            if p.default_timeout_microseconds > bounds::MAX_TIMEOUT_US {
                err(
                    format!("{path}.default_timeout_microseconds"),
                    format!(
                        "must be at most {}, got {}",
                        bounds::MAX_TIMEOUT_US,
                        p.default_timeout_microseconds
                    ),
                );
            }
            if p.max_queue_size > bounds::MAX_QUEUE_SIZE {
                err(
                    format!("{path}.max_queue_size"),
                    format!(
                        "must be at most {}, got {}",
                        bounds::MAX_QUEUE_SIZE,
                        p.max_queue_size
                    ),
                );
            }
        }
        for l in db.priority_queue_policy.keys() {
            if *l < 1 || *l > levels {
                err(
                    format!("dynamic_batching.priority_queue_policy[{l}]"),
                    format!("level {l} is outside 1..={levels}"),
                );
            }
        }
    }
    if cfg.model_warmup.len() > bounds::MAX_WARMUP_SAMPLES {
        err(
            "model_warmup".into(),
            format!(
                "at most {} samples, got {}",
                bounds::MAX_WARMUP_SAMPLES,
                cfg.model_warmup.len()
            ),
        );
    }
    for (i, w) in cfg.model_warmup.iter().enumerate() {
        let p = format!("model_warmup[{i}]");
        if w.count > bounds::MAX_WARMUP_COUNT {
            err(
                format!("{p}.count"),
                format!(
                    "must be at most {}, got {}",
                    bounds::MAX_WARMUP_COUNT,
                    w.count
                ),
            );
        }
        if w.batch_size < 1 || (cfg.max_batch_size == 0 && w.batch_size != 1) {
            err(
                format!("{p}.batch_size"),
                format!(
                    "must be >= 1 (and 1 when the model does not batch), got {}",
                    w.batch_size
                ),
            );
        } else if cfg.max_batch_size > 0 && w.batch_size as i32 > cfg.max_batch_size {
            err(
                format!("{p}.batch_size"),
                format!(
                    "{} exceeds max_batch_size {}",
                    w.batch_size, cfg.max_batch_size
                ),
            );
        }
        for (name, input) in &w.inputs {
            if !cfg.input.iter().any(|c| &c.name == name) {
                err(
                    format!("{p}.inputs[{name}]"),
                    "is not an input of the model".into(),
                );
            }
            let sources = [
                input.zero_data.is_some(),
                input.random_data.is_some(),
                input.input_data_file.is_some(),
            ];
            if sources.iter().filter(|s| **s).count() != 1 {
                err(
                    format!("{p}.inputs[{name}]"),
                    "needs exactly one of zero_data, random_data, input_data_file".into(),
                );
            }
            if let Some(f) = &input.input_data_file {
                match crate::repository::confine(&model_dir.join("warmup"), f) {
                    Err(why) => err(format!("{p}.inputs[{name}].input_data_file"), why),
                    Ok(path) if !path.is_file() => err(
                        format!("{p}.inputs[{name}].input_data_file"),
                        format!("file 'warmup/{f}' not found in the model directory"),
                    ),
                    Ok(_) => {}
                }
            }
            let declared = cfg.input.iter().find(|c| &c.name == name);
            let dims = match (input.dims.is_empty(), declared) {
                (false, _) => &input.dims[..],
                (true, Some(c)) => &c.dims[..],
                (true, None) => &[][..],
            };
            let data_type = input.data_type.or(declared.and_then(|c| c.data_type));
            // Unknown or BYTES elements count 4 bytes each (BYTES' length prefix).
            let elem = data_type.and_then(DataType::size).unwrap_or(4) as u64;
            let bytes = dims
                .iter()
                .try_fold(u64::from(w.batch_size.max(1)) * elem, |acc, &d| {
                    u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
                });
            match bytes {
                _ if dims.iter().any(|&d| d < 0) => {}
                Some(b) if b <= bounds::MAX_WARMUP_BYTES => {}
                _ => err(
                    format!("{p}.inputs[{name}].dims"),
                    format!(
                        "a warm-up input of {dims:?} (batch {}) is larger than the maximum of {} bytes",
                        w.batch_size,
                        bounds::MAX_WARMUP_BYTES
                    ),
                ),
            }
        }
    }
    // `check_tensor` refused every tensor without a datatype, and `max_batch_size` was bounded,
    // so a config with no errors has a signature.
    let signature = errs.is_empty().then(|| Signature::of(cfg));
    match signature {
        Some(Ok(signature)) => Ok((steps, sequence, params, signature)),
        Some(Err(e)) => Err(ConfigErrors {
            model: dir_name.to_string(),
            errors: vec![e],
        }),
        None => Err(ConfigErrors {
            model: dir_name.to_string(),
            errors: errs,
        }),
    }
}

fn check_tensor(
    err: &mut impl FnMut(String, String),
    p: &str,
    name: &str,
    data_type: Option<DataType>,
    dims: &[i64],
    reshape: Option<&Reshape>,
) {
    if name.is_empty() {
        err(format!("{p}.name"), "must not be empty".into());
    }
    let label = if name.is_empty() {
        p.to_string()
    } else {
        format!("{p} '{name}'")
    };
    if data_type.is_none() {
        err(
            format!("{label}.data_type"),
            "must be a valid type such as TYPE_FP32, got none".into(),
        );
    }
    if dims.is_empty() && reshape.is_none() {
        err(
            format!("{label}.dims"),
            "must be set (use [1] with reshape { shape: [] } for a scalar)".into(),
        );
    }
    if dims.len() > bounds::MAX_RANK {
        err(
            format!("{label}.dims"),
            format!(
                "at most {} dimensions, got {}",
                bounds::MAX_RANK,
                dims.len()
            ),
        );
    }
    for &d in dims {
        if d < -1 || d == 0 || d > bounds::MAX_DIM {
            err(
                format!("{label}.dims"),
                format!(
                    "dimension {d} is invalid, expected 1..={} or -1 (variable) in {dims:?}",
                    bounds::MAX_DIM
                ),
            );
        }
    }
    // The product of the fixed dims, if it stays within bounds.
    let elements = |v: &[i64]| {
        v.iter()
            .filter(|&&d| d > 0)
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= bounds::MAX_ELEMENTS)
    };
    if elements(dims).is_none() {
        err(
            format!("{label}.dims"),
            format!("{dims:?} holds more than {} elements", bounds::MAX_ELEMENTS),
        );
    }
    if let Some(r) = reshape {
        if r.shape.len() > bounds::MAX_RANK
            || r.shape
                .iter()
                .any(|&d| !(-1..=bounds::MAX_DIM).contains(&d))
            || elements(&r.shape).is_none()
        {
            err(
                format!("{label}.reshape"),
                format!(
                    "shape {:?} must have at most {} dimensions, each in 1..={} or -1, and at most {} elements",
                    r.shape,
                    bounds::MAX_RANK,
                    bounds::MAX_DIM,
                    bounds::MAX_ELEMENTS
                ),
            );
            return;
        }
        let fixed = |v: &[i64]| v.iter().all(|&d| d > 0);
        if fixed(dims) && fixed(&r.shape) {
            let a = elements(dims).unwrap_or(-1);
            let b = elements(&r.shape).unwrap_or(-1);
            if a != b {
                err(
                    format!("{label}.reshape"),
                    format!(
                        "shape {:?} has {b} elements but dims {dims:?} have {a}",
                        r.shape
                    ),
                );
            }
        }
    }
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
