//! Completing a config from what the model file declares ([`autocomplete`]), and the defaults
//! every config gets ([`normalize`]).

use std::path::Path;

use super::*;

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
