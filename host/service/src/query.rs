//! Questions about the server and its models, answered as plain structs that each front end
//! encodes: metadata, readiness, configs, statistics and the repository index.

use std::sync::Arc;

use wisp_core::config::{ModelConfig, TensorSpec};
use wisp_core::{ErrorKind, Result};
use wisp_scheduler::DurationStat;

use super::{Service, EXTENSIONS};
use crate::models::{IndexEntry, ModelVersion, VersionState};

/// Server metadata.
pub struct ServerMetadata {
    /// Server name.
    pub name: &'static str,
    /// Server version.
    pub version: &'static str,
    /// Supported extensions.
    pub extensions: &'static [&'static str],
}

/// One input or output as model metadata describes it.
pub struct TensorMetadata {
    /// Tensor name.
    pub name: String,
    /// KServe datatype name.
    pub datatype: &'static str,
    /// Shape, `-1` for the batch dimension and variable dimensions.
    pub shape: Vec<i64>,
}

/// Model metadata.
pub struct ModelMetadata {
    /// Model name.
    pub name: String,
    /// The version asked for, or every ready version.
    pub versions: Vec<String>,
    /// Platform.
    pub platform: String,
    /// Inputs.
    pub inputs: Vec<TensorMetadata>,
    /// Outputs.
    pub outputs: Vec<TensorMetadata>,
    /// The engine serving the version (Wisp-specific, HTTP `parameters.engine`).
    pub engine: String,
    /// What the version's gate measured against the version it replaced, when it passed one
    /// (Wisp-specific, HTTP `parameters.gate`).
    pub gate: Option<String>,
}

/// A count and a total duration.
#[derive(Debug, Clone, Copy, Default)]
pub struct Duration {
    /// How many.
    pub count: u64,
    /// Total nanoseconds.
    pub ns: u64,
}

impl From<&DurationStat> for Duration {
    fn from(s: &DurationStat) -> Self {
        let (count, ns) = s.get();
        Duration { count, ns }
    }
}

/// Statistics of one batch size.
pub struct BatchStats {
    /// The batch size.
    pub batch_size: u64,
    /// Executions of that size.
    pub count: u64,
    /// Input preparation, total ns.
    pub input_ns: u64,
    /// Inference, total ns.
    pub infer_ns: u64,
    /// Output extraction, total ns.
    pub output_ns: u64,
}

/// Statistics of one model version (Triton's statistics extension).
pub struct VersionStats {
    /// Model name.
    pub name: String,
    /// Version.
    pub version: u64,
    /// Milliseconds since the epoch of the last inference (0: none).
    pub last_inference: u64,
    /// Requests inferred.
    pub inference_count: u64,
    /// Executions (batches).
    pub execution_count: u64,
    /// Successful requests.
    pub success: Duration,
    /// Failed requests.
    pub fail: Duration,
    /// Time queued.
    pub queue: Duration,
    /// Input preparation.
    pub compute_input: Duration,
    /// Inference.
    pub compute_infer: Duration,
    /// Output extraction.
    pub compute_output: Duration,
    /// Response-cache hits.
    pub cache_hit: Duration,
    /// Response-cache misses.
    pub cache_miss: Duration,
    /// Per batch size.
    pub batches: Vec<BatchStats>,
    /// For an ensemble, per step: its model and the requests that skipped it because an input
    /// it requires was not produced (a Wisp addition; empty for other models).
    pub skipped_steps: Vec<(String, u64)>,
}

fn tensor_metadata(t: &TensorSpec, batches: bool) -> TensorMetadata {
    TensorMetadata {
        name: t.name.clone(),
        datatype: t.datatype.as_str(),
        shape: if batches {
            std::iter::once(-1).chain(t.dims.iter().copied()).collect()
        } else {
            t.dims.clone()
        },
    }
}

fn version_stats(m: &ModelVersion) -> VersionStats {
    let s = m.stats();
    VersionStats {
        name: m.name.clone(),
        version: m.version,
        last_inference: s.last_inference_ms(),
        inference_count: s.inference_count(),
        execution_count: s.execution_count(),
        success: (&s.success).into(),
        fail: (&s.fail).into(),
        queue: (&s.queue).into(),
        compute_input: (&s.compute_input).into(),
        compute_infer: (&s.compute_infer).into(),
        compute_output: (&s.compute_output).into(),
        cache_hit: (&s.cache_hit).into(),
        cache_miss: (&s.cache_miss).into(),
        batches: s
            .batch_stats()
            .into_iter()
            .map(|(size, b)| BatchStats {
                batch_size: size as u64,
                count: b.count,
                input_ns: b.input_ns,
                infer_ns: b.infer_ns,
                output_ns: b.output_ns,
            })
            .collect(),
        skipped_steps: m.step_skips(),
    }
}

impl Service {
    /// Server metadata.
    pub fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: "wisp",
            version: env!("CARGO_PKG_VERSION"),
            extensions: EXTENSIONS,
        }
    }

    /// Whether the server is ready: under `--strict-readiness`, unless a model that failed to
    /// load at start-up is still loaded and not ready (see `Service::startup_failures`).
    pub fn server_ready(&self) -> bool {
        !self.strict_readiness
            || self
                .startup_failures
                .iter()
                .all(|name| self.registry.entry(name).ok().is_none_or(|e| e.is_ready()))
    }

    /// Whether a model (version) is ready, as Triton answers it: a model or version that is
    /// unknown, not loaded or not ready is simply not ready (`Ok(Err(why))`); only a malformed
    /// version is an error.
    pub fn model_ready(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<std::result::Result<(), wisp_core::Error>> {
        match self.registry.check_ready(model, version) {
            Ok(()) => Ok(Ok(())),
            Err(e) if e.kind() == ErrorKind::InvalidArg => Err(e),
            Err(why) => Ok(Err(why)),
        }
    }

    /// Model metadata of a ready version.
    pub fn model_metadata(&self, model: &str, version: Option<&str>) -> Result<ModelMetadata> {
        let m = self.registry.get(model, version)?;
        let entry = self.registry.entry(model)?;
        let (cfg, sig) = (&m.config, &m.signature);
        let versions = match version {
            Some(v) => vec![v.to_string()],
            None => entry
                .versions
                .iter()
                .filter(|(_, s)| matches!(s, VersionState::Ready(_)))
                .map(|(v, _)| v.to_string())
                .collect(),
        };
        Ok(ModelMetadata {
            name: cfg.name.clone(),
            versions,
            platform: cfg.platform.clone(),
            inputs: sig
                .inputs
                .iter()
                .map(|t| tensor_metadata(t, sig.batches()))
                .collect(),
            outputs: sig
                .outputs
                .iter()
                .map(|t| tensor_metadata(t, sig.batches()))
                .collect(),
            engine: m.engine.clone(),
            gate: m.gate.as_ref().map(|g| format!("passed {g}")),
        })
    }

    /// The config a ready version runs with.
    pub fn model_config(&self, model: &str, version: Option<&str>) -> Result<Arc<ModelConfig>> {
        Ok(self.registry.get(model, version)?.config.clone())
    }

    /// Statistics of every ready version of `model` (of every model when `None`), or of one
    /// version. An unknown model or version is an error.
    pub fn statistics(
        &self,
        model: Option<&str>,
        version: Option<&str>,
    ) -> Result<Vec<VersionStats>> {
        if let Some(name) = model {
            self.registry.entry(name)?;
            if version.is_some() {
                self.registry.get(name, version)?;
            }
        }
        let mut out = Vec::new();
        for (name, entry) in self.registry.models() {
            if model.is_some_and(|m| m != name) {
                continue;
            }
            for (v, state) in &entry.versions {
                if version.is_some_and(|want| want.parse::<u64>().ok() != Some(*v)) {
                    continue;
                }
                if let VersionState::Ready(m) = state {
                    out.push(version_stats(m));
                }
            }
        }
        Ok(out)
    }

    /// The repository index (`ready`: ready versions only).
    pub fn index(&self, ready: bool) -> Result<Vec<IndexEntry>> {
        self.registry.index(ready)
    }
}
