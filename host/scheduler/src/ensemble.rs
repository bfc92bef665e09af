//! Ensemble pipelines as an event-driven DAG (Triton's `ensemble_scheduling`).
//!
//! A [`Plan`] is checked once at load: every step input is produced by exactly one source (an
//! ensemble input or one step's output), there are no cycles, and every ensemble output is
//! produced. A [`Run`] is one request going through the plan as a state machine: it hands out
//! the steps whose inputs are all ready ([`StepCall`]s, which the caller sends to each step's
//! model scheduler, so steps batch with other traffic), and each completion may release more
//! steps. Independent steps are therefore in flight at the same time; tensors move between
//! steps by reference (their data is shared `Bytes`, never copied).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use wisp_core::{Error, InferRequest, InferResponse, Result, Tensor};

/// One step: a model and how its tensors map to the ensemble's.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The composing model.
    pub model: String,
    /// Its version (`None`: the latest ready one, Triton's `-1`).
    pub version: Option<u64>,
    /// (step input name, ensemble tensor name).
    pub inputs: Vec<(String, String)>,
    /// (step output name, ensemble tensor name).
    pub outputs: Vec<(String, String)>,
}

impl Step {
    /// `step i ('model')`, for messages.
    pub fn label(&self, index: usize) -> String {
        format!("step {index} ('{}')", self.model)
    }
}

/// A validated ensemble DAG.
#[derive(Debug)]
pub struct Plan {
    name: String,
    steps: Vec<Step>,
    outputs: Vec<String>,
    /// Steps reading each ensemble tensor.
    consumers: HashMap<String, Vec<usize>>,
}

impl Plan {
    /// Checks the DAG of ensemble `name`; the error lists every problem, each naming its step.
    pub fn new(
        name: &str,
        inputs: &[String],
        outputs: &[String],
        steps: Vec<Step>,
    ) -> Result<Plan> {
        let mut errs = Vec::new();
        if steps.is_empty() {
            errs.push("ensemble_scheduling has no steps".to_string());
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
        let mut consumers: HashMap<String, Vec<usize>> = HashMap::new();
        for (n, s) in steps.iter().enumerate() {
            for (_, tensor) in &s.inputs {
                consumers.entry(tensor.clone()).or_default().push(n);
            }
        }
        if errs.is_empty() {
            if let Some(cycle) = find_cycle(&steps, &consumers) {
                let names: Vec<String> = cycle.iter().map(|&i| steps[i].label(i)).collect();
                errs.push(format!("the steps form a cycle: {}", names.join(" → ")));
            }
        }
        if !errs.is_empty() {
            return Err(Error::invalid(format!(
                "ensemble '{name}': {}",
                errs.join("; ")
            )));
        }
        Ok(Plan {
            name: name.to_string(),
            steps,
            outputs: outputs.to_vec(),
            consumers,
        })
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }
}

/// A cycle of steps, if any (depth-first search over step → consuming steps).
fn find_cycle(steps: &[Step], consumers: &HashMap<String, Vec<usize>>) -> Option<Vec<usize>> {
    fn visit(
        n: usize,
        steps: &[Step],
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

/// A step ready to run: send `request` to `plan.steps()[step]`'s model.
#[derive(Debug)]
pub struct StepCall {
    /// Index of the step.
    pub step: usize,
    /// Its request (inputs renamed to the step's names).
    pub request: InferRequest,
}

/// What a run needs next.
#[derive(Debug)]
pub enum Progress {
    /// Send these calls (possibly none) and report each completion.
    Continue(Vec<StepCall>),
    /// The request is finished.
    Done(Result<InferResponse>),
}

/// One request going through a [`Plan`].
pub struct Run {
    plan: Arc<Plan>,
    tensors: HashMap<String, Tensor>,
    /// Inputs still missing per step.
    missing: Vec<usize>,
    outstanding: usize,
    done: bool,
    template: InferRequest,
}

impl Run {
    /// Starts `request` on `plan`: returns the run and the first steps to send.
    pub fn start(plan: Arc<Plan>, request: InferRequest) -> (Run, Progress) {
        let missing = plan.steps.iter().map(|s| s.inputs.len()).collect();
        let mut tensors = HashMap::new();
        let mut template = request;
        for t in std::mem::take(&mut template.inputs) {
            tensors.insert(t.name.clone(), t);
        }
        template.requested_outputs.clear();
        let mut run = Run {
            plan,
            tensors,
            missing,
            outstanding: 0,
            done: false,
            template,
        };
        let names: Vec<String> = run.tensors.keys().cloned().collect();
        let calls = run.release(&names);
        let progress = run.progress(calls);
        (run, progress)
    }

    /// Reports step `step`'s outcome; returns what to do next.
    pub fn complete(&mut self, step: usize, result: Result<InferResponse>) -> Progress {
        if self.done {
            return Progress::Continue(Vec::new());
        }
        self.outstanding -= 1;
        let s = &self.plan.steps[step];
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                self.done = true;
                return Progress::Done(Err(e.context(format!(
                    "ensemble '{}' {}",
                    self.plan.name,
                    s.label(step)
                ))));
            }
        };
        let mut produced = Vec::new();
        for (out, tensor) in &s.outputs {
            let Some(t) = response.outputs.iter().find(|t| &t.name == out) else {
                self.done = true;
                return Progress::Done(Err(Error::internal(format!(
                    "ensemble '{}' {}: the model returned no output '{out}'",
                    self.plan.name,
                    s.label(step)
                ))));
            };
            let mut t = t.clone();
            t.name = tensor.clone();
            self.tensors.insert(tensor.clone(), t);
            produced.push(tensor.clone());
        }
        let calls = self.release(&produced);
        self.progress(calls)
    }

    /// Counts `names` as available and returns the steps that became ready.
    fn release(&mut self, names: &[String]) -> Vec<StepCall> {
        let mut calls = Vec::new();
        for name in names {
            for &n in self.plan.consumers.get(name).into_iter().flatten() {
                let reads = self.plan.steps[n]
                    .inputs
                    .iter()
                    .filter(|(_, t)| t == name)
                    .count();
                self.missing[n] -= reads;
                if self.missing[n] == 0 {
                    calls.push(self.call(n));
                }
            }
        }
        calls
    }

    fn call(&self, n: usize) -> StepCall {
        let s = &self.plan.steps[n];
        let mut request = self.template.clone();
        request.inputs = s
            .inputs
            .iter()
            .map(|(input, tensor)| {
                let mut t = self.tensors[tensor].clone();
                t.name = input.clone();
                t
            })
            .collect();
        request.requested_outputs = s.outputs.iter().map(|(o, _)| o.clone()).collect();
        StepCall { step: n, request }
    }

    fn progress(&mut self, calls: Vec<StepCall>) -> Progress {
        self.outstanding += calls.len();
        if self.outstanding > 0 {
            return Progress::Continue(calls);
        }
        self.done = true;
        let mut outputs = Vec::with_capacity(self.plan.outputs.len());
        for o in &self.plan.outputs {
            match self.tensors.get(o) {
                Some(t) => outputs.push(t.clone()),
                None => {
                    return Progress::Done(Err(Error::internal(format!(
                        "ensemble '{}': output '{o}' was never produced (a step it depends on did not run)",
                        self.plan.name
                    ))))
                }
            }
        }
        Progress::Done(Ok(InferResponse { outputs }))
    }
}

/// Parses Triton's `ensemble_scheduling` (as the JSON form of the config) into steps.
pub fn steps_from_json(value: &serde_json::Value) -> Result<Vec<Step>> {
    let steps = value
        .get("step")
        .and_then(|s| s.as_array())
        .cloned()
        .unwrap_or_default();
    let map = |v: Option<&serde_json::Value>| -> Vec<(String, String)> {
        let m: BTreeMap<String, String> = v
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        m.into_iter().collect()
    };
    steps
        .iter()
        .enumerate()
        .map(|(n, s)| {
            let version = match s.get("model_version") {
                None => -1,
                Some(v) => v
                    .as_i64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .ok_or_else(|| {
                        Error::invalid(format!("step {n}: model_version must be an integer"))
                    })?,
            };
            Ok(Step {
                model: s
                    .get("model_name")
                    .and_then(|m| m.as_str())
                    .unwrap_or_default()
                    .to_string(),
                version: (version >= 0).then_some(version as u64),
                inputs: map(s.get("input_map")),
                outputs: map(s.get("output_map")),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use wisp_core::DataType;

    fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> Step {
        let pairs = |p: &[(&str, &str)]| {
            p.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        Step {
            model: model.into(),
            version: None,
            inputs: pairs(inputs),
            outputs: pairs(outputs),
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn tensor(name: &str, v: f32) -> Tensor {
        Tensor::new(
            name,
            DataType::Fp32,
            vec![1],
            Bytes::copy_from_slice(&v.to_le_bytes()),
        )
        .unwrap()
    }

    fn value(t: &Tensor) -> f32 {
        f32::from_le_bytes(t.data[..4].try_into().unwrap())
    }

    /// Runs a plan where each step's model adds its step number + 1 to the sum of its inputs,
    /// completing calls in reverse order of release (as an unordered scheduler might). Steps in
    /// `fail` return an error. Returns the response and the largest number of steps in flight.
    fn drive(plan: Plan, input: f32, fail: &[usize]) -> (Result<InferResponse>, usize) {
        let plan = Arc::new(plan);
        let req = InferRequest {
            inputs: vec![tensor("IN", input)],
            ..Default::default()
        };
        let (mut run, mut progress) = Run::start(plan.clone(), req);
        let mut queue: Vec<StepCall> = Vec::new();
        let mut widest = 0;
        loop {
            match progress {
                Progress::Done(r) => return (r, widest),
                Progress::Continue(calls) => queue.extend(calls),
            }
            widest = widest.max(queue.len());
            let call = queue
                .pop()
                .expect("a run that is not done has calls in flight");
            let s = &plan.steps()[call.step];
            let result = if fail.contains(&call.step) {
                Err(Error::unavailable("model is not ready"))
            } else {
                let sum: f32 = call.request.inputs.iter().map(value).sum();
                Ok(InferResponse {
                    outputs: s
                        .outputs
                        .iter()
                        .map(|(o, _)| tensor(o, sum + call.step as f32 + 1.0))
                        .collect(),
                })
            };
            progress = run.complete(call.step, result);
        }
    }

    #[test]
    fn chain() {
        let plan = Plan::new(
            "e",
            &names(&["IN"]),
            &names(&["OUT"]),
            vec![
                step("a", &[("x", "IN")], &[("y", "mid")]),
                step("b", &[("x", "mid")], &[("y", "OUT")]),
            ],
        )
        .unwrap();
        let (r, widest) = drive(plan, 10.0, &[]);
        let out = r.unwrap();
        assert_eq!(out.outputs[0].name, "OUT");
        assert_eq!(value(&out.outputs[0]), 13.0);
        assert_eq!(widest, 1);
    }

    #[test]
    fn fan_out_fan_in_diamond_runs_branches_together() {
        let plan = Plan::new(
            "diamond",
            &names(&["IN"]),
            &names(&["OUT", "LEFT"]),
            vec![
                step("split", &[("x", "IN")], &[("y", "s")]),
                step("left", &[("x", "s")], &[("y", "LEFT")]),
                step("right", &[("x", "s")], &[("y", "r")]),
                step("join", &[("a", "LEFT"), ("b", "r")], &[("y", "OUT")]),
            ],
        )
        .unwrap();
        let (r, widest) = drive(plan, 0.0, &[]);
        let out = r.unwrap();
        // split: 1; left: 1+2 = 3; right: 1+3 = 4; join: 3+4+4 = 11.
        assert_eq!(value(&out.outputs[0]), 11.0);
        assert_eq!(value(&out.outputs[1]), 3.0);
        assert_eq!(widest, 2, "both branches were in flight at once");
    }

    #[test]
    fn independent_steps_start_together() {
        let plan = Plan::new(
            "fan",
            &names(&["IN"]),
            &names(&["A", "B", "C"]),
            vec![
                step("a", &[("x", "IN")], &[("y", "A")]),
                step("b", &[("x", "IN")], &[("y", "B")]),
                step("c", &[("x", "IN")], &[("y", "C")]),
            ],
        )
        .unwrap();
        let (r, widest) = drive(plan, 1.0, &[]);
        assert_eq!(r.unwrap().outputs.len(), 3);
        assert_eq!(widest, 3);
    }

    #[test]
    fn a_failing_step_fails_the_request_naming_it() {
        let plan = Plan::new(
            "e",
            &names(&["IN"]),
            &names(&["OUT"]),
            vec![
                step("pre", &[("x", "IN")], &[("y", "mid")]),
                step("model", &[("x", "mid")], &[("y", "OUT")]),
            ],
        )
        .unwrap();
        let e = drive(plan, 0.0, &[1]).0.unwrap_err();
        assert!(
            e.message().contains("ensemble 'e' step 1 ('model')")
                && e.message().contains("not ready"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn validation_names_each_problem() {
        let e = Plan::new(
            "bad",
            &names(&["IN"]),
            &names(&["OUT", "NEVER"]),
            vec![
                step("a", &[("x", "IN")], &[("y", "mid")]),
                step("b", &[("x", "nowhere")], &[("y", "mid")]),
                step("c", &[("x", "mid")], &[("y", "OUT")]),
            ],
        )
        .unwrap_err();
        let m = e.message();
        assert!(
            m.contains(
                "step 1 ('b'): output 'y' maps to 'mid', which step 0 ('a') already produces"
            ),
            "{m}"
        );
        assert!(m.contains("step 1 ('b'): input 'x' reads 'nowhere'"), "{m}");
        assert!(m.contains("ensemble output 'NEVER' is not produced"), "{m}");
    }

    #[test]
    fn cycles_are_rejected() {
        let e = Plan::new(
            "loop",
            &names(&["IN"]),
            &names(&["OUT"]),
            vec![
                step("a", &[("x", "IN"), ("z", "back")], &[("y", "fwd")]),
                step("b", &[("x", "fwd")], &[("y", "back"), ("w", "OUT")]),
            ],
        )
        .unwrap_err();
        assert!(
            e.message()
                .contains("cycle: step 0 ('a') → step 1 ('b') → step 0 ('a')"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn parses_triton_json() {
        let v = serde_json::json!({"step": [
            {"model_name": "pre", "model_version": "-1", "input_map": {"IMAGE": "RAW"}, "output_map": {"PIXELS": "px"}},
            {"model_name": "cls", "model_version": 2, "input_map": {"x": "px"}, "output_map": {"y": "OUT"}}
        ]});
        let steps = steps_from_json(&v).unwrap();
        assert_eq!(steps[0].version, None);
        assert_eq!(steps[1].version, Some(2));
        assert_eq!(
            steps[0].inputs,
            vec![("IMAGE".to_string(), "RAW".to_string())]
        );
    }
}
