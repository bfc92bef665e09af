//! Triton's `ensemble_scheduling`, typed: its steps are read from the config once, when it is
//! validated, and the DAG they form is checked there, so that every problem is reported with
//! the config's other errors (and covered by the golden tests in `tests/ui`).

use std::collections::{BTreeMap, HashMap};

use super::ModelConfig;

/// The config field an ensemble's steps live in.
pub const FIELD: &str = "ensemble_scheduling";

/// One step of an ensemble: a call to a composing model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsembleStep {
    /// The composing model.
    pub model: String,
    /// Its version (`None`: the latest ready one, Triton's `-1`).
    pub version: Option<u64>,
    /// (step input name, ensemble tensor name).
    pub inputs: Vec<(String, String)>,
    /// (step output name, ensemble tensor name).
    pub outputs: Vec<(String, String)>,
}

impl EnsembleStep {
    /// `step i ('model')`, for messages.
    pub fn label(&self, index: usize) -> String {
        format!("step {index} ('{}')", self.model)
    }
}

/// The steps of `cfg`'s `ensemble_scheduling` (none when it has none), or every problem found
/// reading them.
pub fn steps(cfg: &ModelConfig) -> Result<Vec<EnsembleStep>, Vec<String>> {
    let Some(scheduling) = cfg.other.get(FIELD) else {
        return Ok(Vec::new());
    };
    let empty = Vec::new();
    let raw = match scheduling.get("step") {
        None => &empty,
        Some(serde_json::Value::Array(a)) => a,
        Some(_) => return Err(vec!["'step' must be a list of steps".to_string()]),
    };
    // Bounded before anything walks the steps: a long chain would otherwise recurse as deep
    // as it is long in the cycle check.
    if raw.len() > super::bounds::MAX_ENSEMBLE_STEPS {
        return Err(vec![format!(
            "'step' has {} entries, more than {}",
            raw.len(),
            super::bounds::MAX_ENSEMBLE_STEPS
        )]);
    }
    let mut errs = Vec::new();
    let map = |n: usize, key: &str, v: Option<&serde_json::Value>, errs: &mut Vec<String>| match v
        .map(|v| serde_json::from_value::<BTreeMap<String, String>>(v.clone()))
    {
        None => Vec::new(),
        Some(Ok(m)) => m.into_iter().collect(),
        Some(Err(_)) => {
            errs.push(format!(
                "step {n}: {key} must map tensor names to tensor names"
            ));
            Vec::new()
        }
    };
    let mut steps = Vec::with_capacity(raw.len());
    for (n, s) in raw.iter().enumerate() {
        let version = match s.get("model_version") {
            None => None,
            Some(v) => match v.as_i64().or_else(|| v.as_str()?.parse().ok()) {
                Some(v) if v < 0 => None,
                Some(v) => Some(v as u64),
                None => {
                    errs.push(format!(
                        "step {n}: model_version must be an integer, got {v}"
                    ));
                    None
                }
            },
        };
        let model = match s.get("model_name") {
            None => String::new(),
            Some(serde_json::Value::String(m)) => m.clone(),
            Some(other) => {
                errs.push(format!(
                    "step {n}: model_name must be a string, got {other}"
                ));
                String::new()
            }
        };
        steps.push(EnsembleStep {
            model,
            version,
            inputs: map(n, "input_map", s.get("input_map"), &mut errs),
            outputs: map(n, "output_map", s.get("output_map"), &mut errs),
        });
    }
    if errs.is_empty() {
        Ok(steps)
    } else {
        Err(errs)
    }
}

/// The most step requests `max_inflight_requests` may allow at once at each step.
pub const MAX_INFLIGHT_REQUESTS: u64 = 1 << 20;

/// Triton's `ensemble_scheduling { max_inflight_requests: N }`: how many requests may be in
/// flight at each step at once, shared by all of the ensemble's requests (`None`: no limit,
/// Triton's 0). The text parser has already refused a negative, non-integer or 32-bit
/// overflowing value; this bounds it further.
pub fn max_inflight_requests(cfg: &ModelConfig) -> Result<Option<usize>, String> {
    let Some(v) = cfg
        .other
        .get(FIELD)
        .and_then(|s| s.get("max_inflight_requests"))
    else {
        return Ok(None);
    };
    match v.as_u64().or_else(|| v.as_str()?.parse().ok()) {
        Some(0) => Ok(None),
        Some(n) if n <= MAX_INFLIGHT_REQUESTS => Ok(Some(n as usize)),
        _ => Err(format!(
            "max_inflight_requests must be an integer in 0..={MAX_INFLIGHT_REQUESTS}, got {v}"
        )),
    }
}

/// Checks the DAG the steps form between the ensemble's `inputs` and `outputs`: every step
/// names a model and maps inputs and outputs, each tensor has one producer, every tensor read
/// is produced, every output is produced, and there is no cycle. Returns every problem, each
/// naming its step.
pub fn check_dag(inputs: &[String], outputs: &[String], steps: &[EnsembleStep]) -> Vec<String> {
    let mut errs = Vec::new();
    if steps.is_empty() {
        errs.push(format!("{FIELD} has no steps"));
    }
    // Who produces each tensor.
    let mut producer: HashMap<&str, String> = HashMap::new();
    for i in inputs {
        producer.insert(i, format!("ensemble input '{i}'"));
    }
    for (n, s) in steps.iter().enumerate() {
        if s.model.is_empty() {
            errs.push(format!("step {n}: model_name is empty"));
        }
        if s.inputs.is_empty() {
            errs.push(format!("{}: input_map is empty", s.label(n)));
        }
        if s.outputs.is_empty() {
            errs.push(format!("{}: output_map is empty", s.label(n)));
        }
        for (out, tensor) in &s.outputs {
            if let Some(first) = producer.get(tensor.as_str()) {
                errs.push(format!(
                    "{}: output '{out}' maps to '{tensor}', which {first} already produces",
                    s.label(n)
                ));
            } else {
                producer.insert(tensor, s.label(n));
            }
        }
    }
    for (n, s) in steps.iter().enumerate() {
        for (input, tensor) in &s.inputs {
            if !producer.contains_key(tensor.as_str()) {
                errs.push(format!(
                    "{}: input '{input}' reads '{tensor}', which is neither an ensemble input nor any step's output",
                    s.label(n)
                ));
            }
        }
    }
    for o in outputs {
        if !producer.contains_key(o.as_str()) || inputs.contains(o) {
            errs.push(format!("ensemble output '{o}' is not produced by any step"));
        }
    }
    if errs.is_empty() {
        if let Some(cycle) = find_cycle(steps, &consumers(steps)) {
            let names: Vec<String> = cycle.iter().map(|&i| steps[i].label(i)).collect();
            errs.push(format!("the steps form a cycle: {}", names.join(" → ")));
        }
    }
    errs
}

/// The steps reading each ensemble tensor.
pub fn consumers(steps: &[EnsembleStep]) -> HashMap<String, Vec<usize>> {
    let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
    for (n, s) in steps.iter().enumerate() {
        for (_, tensor) in &s.inputs {
            consumers.entry(tensor.clone()).or_default().push(n);
        }
    }
    consumers
}

/// A cycle of steps, if any (depth-first search over step → consuming steps).
fn find_cycle(
    steps: &[EnsembleStep],
    consumers: &HashMap<String, Vec<usize>>,
) -> Option<Vec<usize>> {
    fn visit(
        n: usize,
        steps: &[EnsembleStep],
        consumers: &HashMap<String, Vec<usize>>,
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[n] = 1;
        path.push(n);
        for (_, tensor) in &steps[n].outputs {
            for &next in consumers.get(tensor).into_iter().flatten() {
                match state[next] {
                    1 => {
                        let start = path.iter().position(|&p| p == next).unwrap_or(0);
                        let mut cycle = path[start..].to_vec();
                        cycle.push(next);
                        return Some(cycle);
                    }
                    0 => {
                        if let Some(c) = visit(next, steps, consumers, state, path) {
                            return Some(c);
                        }
                    }
                    _ => {}
                }
            }
        }
        path.pop();
        state[n] = 2;
        None
    }
    let mut state = vec![0u8; steps.len()];
    for n in 0..steps.len() {
        if state[n] == 0 {
            if let Some(c) = visit(n, steps, consumers, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(scheduling: serde_json::Value) -> ModelConfig {
        let mut c = ModelConfig::default();
        c.other.insert(FIELD.to_string(), scheduling);
        c
    }

    #[test]
    fn reads_triton_steps() {
        let steps = steps(&cfg(serde_json::json!({"step": [
            {"model_name": "pre", "model_version": "-1", "input_map": {"IMAGE": "RAW"}, "output_map": {"PIXELS": "px"}},
            {"model_name": "cls", "model_version": 2, "input_map": {"x": "px"}, "output_map": {"y": "OUT"}}
        ]})))
        .unwrap();
        assert_eq!(steps[0].version, None);
        assert_eq!(steps[1].version, Some(2));
        assert_eq!(
            steps[0].inputs,
            vec![("IMAGE".to_string(), "RAW".to_string())]
        );
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_dag(&names(&["RAW"]), &names(&["OUT"]), &steps).is_empty());
    }

    #[test]
    fn a_step_list_longer_than_the_bound_is_refused_before_it_is_walked() {
        // A chain t0 -> t1 -> ... long enough to overflow the stack if walked recursively.
        let n = 200_000;
        let chain: Vec<_> = (0..n)
            .map(|i| {
                serde_json::json!({"model_name": "m", "input_map": {"x": format!("t{i}")},
                    "output_map": {"y": format!("t{}", i + 1)}})
            })
            .collect();
        let errs = steps(&cfg(serde_json::json!({ "step": chain }))).unwrap_err();
        assert_eq!(
            errs,
            vec![format!("'step' has {n} entries, more than 1024")]
        );
    }

    #[test]
    fn bad_steps_are_each_named() {
        let errs = steps(&cfg(serde_json::json!({"step": [
            {"model_name": 3, "model_version": "x", "input_map": {"a": 1}, "output_map": {"b": "c"}}
        ]})))
        .unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].contains("model_version"), "{errs:?}");
        assert!(errs[1].contains("model_name"), "{errs:?}");
        assert!(errs[2].contains("input_map"), "{errs:?}");
    }
}
