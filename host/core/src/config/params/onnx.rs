//! What Triton's ONNX Runtime backend reads from a model's config, read the same way: its
//! `parameters` (thread counts, execution mode, memory arena and pattern, arena shrinkage,
//! initializer allocation) and the `optimization` block (graph level, execution accelerators).
//! A value Triton would refuse is refused here, naming the field; a GPU-only setting is
//! accepted and reported, so that a repository written for Triton loads unchanged on a CPU host.

use serde_json::Value;

use super::{bad, uint, ConfigError, ModelConfig};

/// ONNX Runtime's threads per session for its operators (`intra_op_thread_count`).
pub const INTRA_OP_KEY: &str = "intra_op_thread_count";
/// ONNX Runtime's threads per session across operators (`inter_op_thread_count`).
pub const INTER_OP_KEY: &str = "inter_op_thread_count";
/// The most threads a config may ask ONNX Runtime for, per session.
pub const MAX_OP_THREADS: usize = 256;
/// `0` runs a graph's operators one after another, `1` in parallel (`execution_mode`).
pub const EXECUTION_MODE_KEY: &str = "execution_mode";
/// The CPU memory arena on or off (`enable_mem_arena`).
pub const MEM_ARENA_KEY: &str = "enable_mem_arena";
/// Memory pattern planning on or off (`enable_mem_pattern`).
pub const MEM_PATTERN_KEY: &str = "enable_mem_pattern";
/// Arenas to shrink after each run, such as `cpu:0` (a run option of ONNX Runtime's).
pub const ARENA_SHRINKAGE_KEY: &str = "memory.enable_memory_arena_shrinkage";
/// Initializers in the device allocator rather than the arena (`0`/`1`, a session option).
pub const DEVICE_ALLOCATOR_KEY: &str = "session.use_device_allocator_for_initializers";
/// Wisp's own key: the engine that runs this model (`tract` or `onnxruntime`), whatever the
/// server's `--onnx-engine auto` picked for the others. Triton's backend ignores it.
pub const ENGINE_KEY: &str = "onnx.engine";
/// Settings of ONNX Runtime's CUDA provider, which Triton reads only for GPU instances.
pub const GPU_ONLY_KEYS: [&str; 4] = [
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
];
/// The longest value of `memory.enable_memory_arena_shrinkage` read (`cpu:0;gpu:0` is 11).
const MAX_SHRINKAGE_LEN: usize = 256;
/// The most accelerators one list of `execution_accelerators` may name.
const MAX_ACCELERATORS: usize = 16;

/// How ONNX Runtime runs a graph's operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionMode {
    /// One after another (`0`, ONNX Runtime's default).
    Sequential,
    /// Independent branches at once, on the inter-op threads (`1`).
    Parallel,
}

/// ONNX Runtime's graph optimizations (`optimization { graph { level } }`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GraphLevel {
    /// All of them (the field absent, or `0`, or any level Triton does not name).
    #[default]
    All,
    /// The basic ones (`-1`).
    Basic,
    /// Basic and extended (`1`).
    Extended,
    /// None (`2`).
    Disabled,
}

/// The engine a model asks for with [`ENGINE_KEY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineRequest {
    /// The embedded tract engine, even where ONNX Runtime is loaded.
    Tract,
    /// ONNX Runtime; the model is refused where the server has none.
    OnnxRuntime,
}

/// A CPU execution accelerator the config asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accelerator {
    /// Its name: `openvino` is the only one Triton knows on CPU.
    pub name: String,
    /// Its `parameters`, in order (Triton ignores them for `openvino`).
    pub parameters: Vec<(String, String)>,
}

/// A model's ONNX Runtime settings, as Triton's backend reads them; `None` (or the default)
/// leaves each to the backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OnnxOptions {
    /// `intra_op_thread_count` (0 is ONNX Runtime's own default).
    pub intra_op: Option<usize>,
    /// `inter_op_thread_count` (0 is ONNX Runtime's own default).
    pub inter_op: Option<usize>,
    /// `execution_mode`.
    pub execution_mode: Option<ExecutionMode>,
    /// `enable_mem_arena`.
    pub mem_arena: Option<bool>,
    /// `enable_mem_pattern`.
    pub mem_pattern: Option<bool>,
    /// `memory.enable_memory_arena_shrinkage`, passed to every run.
    pub arena_shrinkage: Option<String>,
    /// `session.use_device_allocator_for_initializers`.
    pub device_allocator_for_initializers: Option<bool>,
    /// `optimization { graph { level } }`.
    pub graph_level: GraphLevel,
    /// [`ENGINE_KEY`]: the engine this model runs on (`None`: the server's).
    pub engine: Option<EngineRequest>,
    /// `optimization { execution_accelerators { cpu_execution_accelerator } }`.
    pub cpu_accelerators: Vec<Accelerator>,
    /// The GPU-only settings the config carries (CUDA provider keys, GPU accelerators by
    /// name): accepted, as Triton does on CPU instances, and named in one warning at load.
    pub gpu_only: Vec<String>,
}

impl OnnxOptions {
    /// Reads Triton's ONNX Runtime backend settings from `cfg`.
    pub fn of(cfg: &ModelConfig) -> Result<OnnxOptions, ConfigError> {
        let count = |key: &str| match uint(cfg, key)? {
            Some(n) if n > MAX_OP_THREADS as u64 => Err(bad(
                key,
                format!("must be at most {MAX_OP_THREADS}, got {n}"),
            )),
            n => Ok(n.map(|n| n as usize)),
        };
        let execution_mode = match cfg.parameter_set(EXECUTION_MODE_KEY) {
            None => None,
            Some(v) => Some(match v.trim().parse::<i64>() {
                Ok(0) => ExecutionMode::Sequential,
                Ok(1) => ExecutionMode::Parallel,
                // Triton's message for the same value.
                _ => {
                    return Err(bad(
                        EXECUTION_MODE_KEY,
                        format!("Invalid execution mode '{v}': 0 (sequential) or 1 (parallel)"),
                    ))
                }
            }),
        };
        let mut gpu_only: Vec<String> = GPU_ONLY_KEYS
            .iter()
            .filter(|k| cfg.parameter_set(k).is_some())
            .map(|k| format!("parameters.{k}"))
            .collect();
        let mem_arena = boolean(cfg, MEM_ARENA_KEY)?;
        let shrinkage = match cfg.parameter_set(ARENA_SHRINKAGE_KEY) {
            None => None,
            Some(v) => shrinkage(v, mem_arena, &mut gpu_only)?,
        };
        let device_allocator = match cfg.parameter_set(DEVICE_ALLOCATOR_KEY) {
            None => None,
            Some("0") => Some(false),
            Some("1") => Some(true),
            Some(v) => {
                return Err(bad(
                    DEVICE_ALLOCATOR_KEY,
                    format!("must be '0' or '1', got '{v}'"),
                ))
            }
        };
        let engine = match cfg.parameter_set(ENGINE_KEY) {
            None => None,
            Some("tract") => Some(EngineRequest::Tract),
            Some("onnxruntime") => Some(EngineRequest::OnnxRuntime),
            Some(v) => {
                return Err(bad(
                    ENGINE_KEY,
                    format!("must be 'tract' or 'onnxruntime', got '{v}'"),
                ))
            }
        };
        let optimization = cfg.other.get("optimization");
        let graph_level = graph_level(optimization)?;
        let accelerators = optimization.and_then(|o| o.get("execution_accelerators"));
        let cpu_accelerators = accelerator_list(accelerators, "cpu_execution_accelerator")?;
        if let Some(bad_one) = cpu_accelerators.iter().find(|a| a.name != "openvino") {
            return Err(ConfigError {
                path: "optimization.execution_accelerators.cpu_execution_accelerator".into(),
                // Triton's message.
                message: format!(
                    "unknown Execution Accelerator '{}' is requested",
                    bad_one.name
                ),
            });
        }
        for a in accelerator_list(accelerators, "gpu_execution_accelerator")? {
            gpu_only.push(format!(
                "optimization.execution_accelerators.gpu_execution_accelerator '{}'",
                a.name
            ));
        }
        Ok(OnnxOptions {
            intra_op: count(INTRA_OP_KEY)?,
            inter_op: count(INTER_OP_KEY)?,
            execution_mode,
            mem_arena,
            mem_pattern: boolean(cfg, MEM_PATTERN_KEY)?,
            arena_shrinkage: shrinkage,
            device_allocator_for_initializers: device_allocator,
            graph_level,
            engine,
            cpu_accelerators,
            gpu_only,
        })
    }
}

/// The CPU arenas of `memory.enable_memory_arena_shrinkage` (`cpu:0;gpu:1`), as ONNX Runtime
/// takes them: `gpu:N` entries are GPU-only (reported in `gpu_only` and left out); on a CPU
/// host the only arena is `cpu:0`, and only when the arena is on. `None` when nothing is left.
fn shrinkage(
    v: &str,
    mem_arena: Option<bool>,
    gpu_only: &mut Vec<String>,
) -> Result<Option<String>, ConfigError> {
    if v.len() > MAX_SHRINKAGE_LEN {
        return Err(bad(
            ARENA_SHRINKAGE_KEY,
            format!("must be at most {MAX_SHRINKAGE_LEN} bytes"),
        ));
    }
    let mut cpu = Vec::new();
    for entry in v.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once(':') {
            Some(("gpu", n)) if n.parse::<u32>().is_ok() => {
                gpu_only.push(format!("parameters.{ARENA_SHRINKAGE_KEY} '{entry}'"));
            }
            Some(("cpu", "0")) => cpu.push(entry),
            _ => {
                return Err(bad(
                    ARENA_SHRINKAGE_KEY,
                    format!("'{entry}' is not an arena of this host: 'cpu:0' (or 'gpu:N', ignored on a CPU host)"),
                ))
            }
        }
    }
    if cpu.is_empty() {
        return Ok(None);
    }
    if mem_arena == Some(false) {
        return Err(bad(
            ARENA_SHRINKAGE_KEY,
            format!("shrinks the CPU arena, which {MEM_ARENA_KEY} turns off"),
        ));
    }
    Ok(Some(cpu.join(";")))
}

/// A boolean parameter as Triton's backends parse one: `true`/`on`/`1` or `false`/`off`/`0`,
/// any case.
fn boolean(cfg: &ModelConfig, key: &str) -> Result<Option<bool>, ConfigError> {
    let Some(v) = cfg.parameter_set(key) else {
        return Ok(None);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(Some(true)),
        "false" | "off" | "0" => Ok(Some(false)),
        _ => Err(bad(
            key,
            format!("failed to convert '{v}' to boolean value"),
        )),
    }
}

fn graph_level(optimization: Option<&Value>) -> Result<GraphLevel, ConfigError> {
    let Some(level) = optimization
        .and_then(|o| o.get("graph"))
        .and_then(|g| g.get("level"))
    else {
        return Ok(GraphLevel::All);
    };
    let n = level
        .as_i64()
        .or_else(|| level.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| ConfigError {
            path: "optimization.graph.level".into(),
            message: format!("must be an integer, got {level}"),
        })?;
    Ok(match n {
        -1 => GraphLevel::Basic,
        1 => GraphLevel::Extended,
        2 => GraphLevel::Disabled,
        _ => GraphLevel::All,
    })
}

fn accelerator_list(
    accelerators: Option<&Value>,
    field: &str,
) -> Result<Vec<Accelerator>, ConfigError> {
    let path = format!("optimization.execution_accelerators.{field}");
    let err = |message: String| ConfigError {
        path: path.clone(),
        message,
    };
    let list = match accelerators.and_then(|a| a.get(field)) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        // One message form: the text format gives a single entry as an object.
        Some(one @ Value::Object(_)) => std::slice::from_ref(one),
        Some(other) => return Err(err(format!("must be a list, got {other}"))),
    };
    if list.len() > MAX_ACCELERATORS {
        return Err(err(format!(
            "names {} accelerators, more than {MAX_ACCELERATORS}",
            list.len()
        )));
    }
    list.iter()
        .map(|a| {
            let name = a
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| err("an accelerator has no 'name'".into()))?;
            let parameters = match a.get("parameters") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(p)) => p
                    .iter()
                    .map(|(k, v)| {
                        let v = v
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string());
                        (k.clone(), v)
                    })
                    .collect(),
                Some(other) => {
                    return Err(err(format!(
                        "accelerator '{name}': 'parameters' must be a map, got {other}"
                    )))
                }
            };
            Ok(Accelerator {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_pbtxt;

    fn options(body: &str) -> Result<OnnxOptions, ConfigError> {
        let text = format!("name: \"m\" platform: \"onnxruntime_onnx\"\n{body}");
        OnnxOptions::of(&parse_pbtxt("m", &text).unwrap())
    }

    fn param(key: &str, value: &str) -> String {
        format!("parameters {{ key: \"{key}\" value {{ string_value: \"{value}\" }} }}\n")
    }

    #[test]
    fn tritons_keys_are_read() {
        let o = options(
            &[
                param("intra_op_thread_count", "2"),
                param("inter_op_thread_count", "0"),
                param("execution_mode", "1"),
                param("enable_mem_arena", "True"),
                param("enable_mem_pattern", "on"),
                param("memory.enable_memory_arena_shrinkage", "cpu:0"),
                param("session.use_device_allocator_for_initializers", "1"),
                "optimization { graph { level: -1 } }".into(),
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!((o.intra_op, o.inter_op), (Some(2), Some(0)));
        assert_eq!(o.execution_mode, Some(ExecutionMode::Parallel));
        assert_eq!((o.mem_arena, o.mem_pattern), (Some(true), Some(true)));
        assert_eq!(
            options(&param("enable_mem_arena", "OFF"))
                .unwrap()
                .mem_arena,
            Some(false)
        );
        assert_eq!(o.arena_shrinkage.as_deref(), Some("cpu:0"));
        assert_eq!(o.device_allocator_for_initializers, Some(true));
        assert_eq!(o.graph_level, GraphLevel::Basic);
        assert!(o.gpu_only.is_empty() && o.cpu_accelerators.is_empty());
        assert_eq!(options("").unwrap(), OnnxOptions::default());
    }

    #[test]
    fn graph_levels_are_tritons() {
        for (level, want) in [
            ("-1", GraphLevel::Basic),
            ("0", GraphLevel::All),
            ("1", GraphLevel::Extended),
            ("2", GraphLevel::Disabled),
            ("7", GraphLevel::All),
        ] {
            let o = options(&format!("optimization {{ graph {{ level: {level} }} }}")).unwrap();
            assert_eq!(o.graph_level, want, "level {level}");
        }
    }

    #[test]
    fn values_triton_refuses_are_refused_naming_the_field() {
        let e = options(&param("execution_mode", "2")).unwrap_err();
        assert_eq!(e.path, "parameters.execution_mode");
        assert!(
            e.message.contains("Invalid execution mode"),
            "{}",
            e.message
        );
        let e = options(&param("enable_mem_arena", "yes")).unwrap_err();
        assert_eq!(e.path, "parameters.enable_mem_arena");
        assert!(e.message.contains("boolean"), "{}", e.message);
        let e = options(&param("session.use_device_allocator_for_initializers", "2")).unwrap_err();
        assert_eq!(
            e.path,
            "parameters.session.use_device_allocator_for_initializers"
        );
        let e = options(&param("intra_op_thread_count", "100000")).unwrap_err();
        assert!(e.message.contains("at most 256"), "{}", e.message);
        let long = "c".repeat(MAX_SHRINKAGE_LEN + 1);
        assert!(options(&param(ARENA_SHRINKAGE_KEY, &long)).is_err());
        let e = options(&param(ARENA_SHRINKAGE_KEY, "cpu:1")).unwrap_err();
        assert!(e.message.contains("'cpu:1'"), "{}", e.message);
        let e = options(
            &[
                param(ARENA_SHRINKAGE_KEY, "cpu:0"),
                param(MEM_ARENA_KEY, "0"),
            ]
            .concat(),
        )
        .unwrap_err();
        assert_eq!(e.path, format!("parameters.{ARENA_SHRINKAGE_KEY}"));
        assert!(e.message.contains(MEM_ARENA_KEY), "{}", e.message);
    }

    #[test]
    fn accelerators_follow_tritons_rules() {
        let o = options(
            r#"optimization { execution_accelerators {
                 cpu_execution_accelerator: [ { name: "openvino" parameters { key: "device_type" value: "CPU" } } ]
                 gpu_execution_accelerator: [ { name: "tensorrt" }, { name: "cuda" } ] } }"#,
        )
        .unwrap();
        assert_eq!(
            o.cpu_accelerators,
            vec![Accelerator {
                name: "openvino".into(),
                parameters: vec![("device_type".into(), "CPU".into())],
            }]
        );
        assert_eq!(o.gpu_only.len(), 2, "{:?}", o.gpu_only);
        assert!(o.gpu_only[0].contains("'tensorrt'"));

        let e = options(
            r#"optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "npu9000" } ] } }"#,
        )
        .unwrap_err();
        assert_eq!(
            e.path,
            "optimization.execution_accelerators.cpu_execution_accelerator"
        );
        assert_eq!(
            e.message,
            "unknown Execution Accelerator 'npu9000' is requested"
        );

        let o = options(&param("gpu_mem_limit", "1000000")).unwrap();
        assert_eq!(o.gpu_only, vec!["parameters.gpu_mem_limit".to_string()]);
        let o = options(&param(ARENA_SHRINKAGE_KEY, "cpu:0;gpu:1")).unwrap();
        assert_eq!(o.arena_shrinkage.as_deref(), Some("cpu:0"));
        assert_eq!(o.gpu_only.len(), 1, "{:?}", o.gpu_only);
    }
}
