//! Ensemble pipelines as an event-driven DAG (Triton's `ensemble_scheduling`).
//!
//! A [`Plan`] is checked once at load: every step input is produced by exactly one source (an
//! ensemble input or one step's output), there are no cycles, and every ensemble output is
//! produced. A [`Run`] is one request going through the plan as a state machine: it hands out
//! the steps whose inputs are all ready ([`StepCall`]s, which the caller sends to each step's
//! model scheduler, so steps batch with other traffic), and each completion may release more
//! steps. Independent steps are therefore in flight at the same time; tensors move between
//! steps by reference (their data is shared `Bytes`, never copied).
//!
//! Steps decide by dataflow. A step may leave an output unset (a plugin returns without it);
//! that tensor is then absent. A step with a required input absent does not run, and its
//! outputs are absent in turn, so everything that needs only them is skipped too; an input its
//! model declares `optional: true` is passed as absent instead (left out of the step's request).
//! The run answers the outputs that were produced: one the client named that was not is an
//! error naming the step that skipped it, and one it did not name is left out. No config field
//! is added, so such a repository still parses in Triton. Skipped steps are counted.
//!
//! Batching and non-batching models meet as in Triton: every tensor remembers the batch size
//! of the request that made it (0 when that model or ensemble does not batch), and a tensor
//! crossing to the other kind gains or loses a leading batch dimension of 1 when its dims say
//! it needs one ([`reshape`]). So a non-batching ensemble's `[16]` reaches a batching step
//! declaring `[-1]` as `[1, 16]`, and its `[1, 16]` answer leaves the ensemble as `[16]`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use wisp_core::{Error, InferRequest, InferResponse, Result, Tensor};

pub use wisp_core::config::ensemble::EnsembleStep as Step;

/// A validated ensemble DAG.
#[derive(Debug)]
pub struct Plan {
    name: String,
    /// The ensemble's inputs: those a request leaves out (optional ones) are absent.
    inputs: Vec<String>,
    steps: Vec<Step>,
    outputs: Vec<String>,
    /// Steps reading each ensemble tensor.
    consumers: HashMap<String, Vec<usize>>,
    /// The step producing each step output.
    producers: HashMap<String, usize>,
    /// The declared dims the batch rule needs, once [`Plan::with_shapes`] set them.
    shapes: Option<PlanShapes>,
}

/// What a model declares about the tensors it takes or gives: whether it batches, and each
/// tensor's dims without the batch dimension (`-1` for any size).
#[derive(Debug, Clone, Default)]
pub struct Shapes {
    /// `max_batch_size > 0`.
    pub batching: bool,
    /// Dims per tensor name (a step model's inputs, or the ensemble's outputs).
    pub dims: HashMap<String, Vec<i64>>,
    /// A step model's inputs declared `optional: true`: absent, they are left out of its
    /// request rather than skipping the step.
    pub optional: HashSet<String>,
}

#[derive(Debug)]
struct PlanShapes {
    /// The ensemble itself: its batching and its outputs' dims.
    ensemble: Shapes,
    /// Each step's model: its batching and its inputs' dims.
    steps: Vec<Shapes>,
}

/// Triton's batch conversion between batching and non-batching models (its
/// `ReshapeTensorDims`). `dims` is the tensor's full shape and `batch` the batch size of the
/// request that produced it (0 when that model did not batch); `to` is what the receiving side
/// declares for it. A tensor from a non-batching context whose shape already matches a batching
/// receiver's dims gains a batch of 1; a batch-1 tensor from a batching context whose shape does
/// not match a non-batching receiver's dims loses it. Everything else passes unchanged (and is
/// checked against the receiver's config when it is validated there).
pub fn reshape(to_dims: &[i64], to_batching: bool, batch: usize, dims: &[i64]) -> Vec<i64> {
    let fits =
        to_dims.len() == dims.len() && to_dims.iter().zip(dims).all(|(&c, &d)| c < 0 || c == d);
    if to_batching && batch == 0 && fits {
        return std::iter::once(1).chain(dims.iter().copied()).collect();
    }
    if !to_batching && batch == 1 && !fits && !dims.is_empty() {
        return dims[1..].to_vec();
    }
    dims.to_vec()
}

impl Plan {
    /// Checks the DAG of ensemble `name`; the error lists every problem, each naming its step.
    pub fn new(
        name: &str,
        inputs: &[String],
        outputs: &[String],
        steps: Vec<Step>,
    ) -> Result<Plan> {
        let errs = wisp_core::config::ensemble::check_dag(inputs, outputs, &steps);
        if !errs.is_empty() {
            return Err(Error::invalid(format!(
                "ensemble '{name}': {}",
                errs.join("; ")
            )));
        }
        let consumers = wisp_core::config::ensemble::consumers(&steps);
        let producers = steps
            .iter()
            .enumerate()
            .flat_map(|(n, s)| s.outputs.iter().map(move |(_, t)| (t.clone(), n)))
            .collect();
        Ok(Plan {
            name: name.to_string(),
            inputs: inputs.to_vec(),
            steps,
            outputs: outputs.to_vec(),
            consumers,
            producers,
            shapes: None,
        })
    }

    /// Declares the ensemble's and every step model's shapes (`steps` in step order), which
    /// turns on the batch conversion between batching and non-batching models.
    pub fn with_shapes(mut self, ensemble: Shapes, steps: Vec<Shapes>) -> Result<Plan> {
        if steps.len() != self.steps.len() {
            return Err(Error::internal(format!(
                "ensemble '{}': {} step shapes for {} steps",
                self.name,
                steps.len(),
                self.steps.len()
            )));
        }
        self.shapes = Some(PlanShapes { ensemble, steps });
        Ok(self)
    }

    /// Which steps the ensemble outputs `wanted` depend on (all of them when `wanted` is
    /// empty): as in Triton, a step no requested output needs is not run.
    pub fn needed(&self, wanted: &[String]) -> Vec<bool> {
        if wanted.is_empty() {
            return vec![true; self.steps.len()];
        }
        let mut needed = vec![false; self.steps.len()];
        let mut tensors: Vec<&String> = wanted.iter().collect();
        while let Some(t) = tensors.pop() {
            if let Some(&n) = self.producers.get(t) {
                if !needed[n] {
                    needed[n] = true;
                    tensors.extend(self.steps[n].inputs.iter().map(|(_, t)| t));
                }
            }
        }
        needed
    }

    /// The steps.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Whether step `n`'s model declares its input `input` optional.
    fn optional(&self, n: usize, input: &str) -> bool {
        self.shapes
            .as_ref()
            .is_some_and(|s| s.steps[n].optional.contains(input))
    }
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

/// Why a tensor of a run is absent.
#[derive(Debug, Clone, Copy)]
enum Absent {
    /// An ensemble input the request did not send (an optional one).
    NotSent,
    /// Step `step` answered without its `output`-th mapped output.
    Unset { step: usize, output: usize },
    /// Step `step` did not run: its `input`-th input (a required one) was absent.
    Skipped { step: usize, input: usize },
}

/// One request going through a [`Plan`].
pub struct Run {
    plan: Arc<Plan>,
    tensors: HashMap<String, Tensor>,
    /// The batch size of the request that made each tensor (0: it did not batch).
    batch: HashMap<String, usize>,
    /// The batch size of each step's request once it was sent (0: its model does not batch).
    step_batch: Vec<usize>,
    /// Inputs not yet produced or known absent, per step.
    missing: Vec<usize>,
    /// Why each absent tensor is absent (worded only if a client is told).
    absent: HashMap<String, Absent>,
    /// Per step, why it cannot run: the index of a required input that is absent.
    blocked: Vec<Option<usize>>,
    /// Steps that did not run because a required input was absent, in the order they were
    /// skipped.
    skipped: Vec<usize>,
    outstanding: usize,
    done: bool,
    template: InferRequest,
    /// Steps to run (the others feed no requested output).
    needed: Vec<bool>,
    /// The ensemble outputs to answer with, in plan order.
    answer: Vec<String>,
    /// Whether the client named the outputs it wants (then each must be produced).
    named: bool,
}

impl Run {
    /// Starts `request` on `plan`: returns the run and the first steps to send.
    pub fn start(plan: Arc<Plan>, request: InferRequest) -> (Run, Progress) {
        let missing = plan.steps.iter().map(|s| s.inputs.len()).collect();
        let mut tensors = HashMap::new();
        let mut batch = HashMap::new();
        let mut template = request;
        let batching = plan.shapes.as_ref().is_some_and(|s| s.ensemble.batching);
        for t in std::mem::take(&mut template.inputs) {
            let b = match t.shape.first() {
                Some(&n) if batching => usize::try_from(n).unwrap_or(0),
                _ => 0,
            };
            batch.insert(t.name.clone(), b);
            tensors.insert(t.name.clone(), t);
        }
        let wanted = std::mem::take(&mut template.requested_outputs);
        let wanted: Vec<String> = wanted
            .into_iter()
            .filter(|o| plan.outputs.contains(o))
            .collect();
        let needed = plan.needed(&wanted);
        let answer = plan
            .outputs
            .iter()
            .filter(|o| wanted.is_empty() || wanted.contains(o))
            .cloned()
            .collect();
        let step_batch = vec![0; plan.steps.len()];
        let blocked = vec![None; plan.steps.len()];
        let mut run = Run {
            plan,
            tensors,
            batch,
            step_batch,
            missing,
            absent: HashMap::new(),
            blocked,
            skipped: Vec::new(),
            outstanding: 0,
            done: false,
            template,
            needed,
            answer,
            named: !wanted.is_empty(),
        };
        let mut resolved: Vec<(String, Option<Absent>)> =
            run.tensors.keys().map(|n| (n.clone(), None)).collect();
        // An ensemble input the request left out (validation lets only optional ones be).
        for i in &run.plan.inputs {
            if !run.tensors.contains_key(i) {
                resolved.push((i.clone(), Some(Absent::NotSent)));
            }
        }
        let calls = run.release(resolved);
        let progress = run.progress(calls);
        (run, progress)
    }

    /// The steps that did not run because a required input was absent.
    pub fn skipped(&self) -> &[usize] {
        &self.skipped
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
        let mut resolved = Vec::with_capacity(s.outputs.len());
        for (k, (out, tensor)) in s.outputs.iter().enumerate() {
            // An output the step left unset is absent: what needs it is skipped.
            let Some(t) = response.outputs.iter().find(|t| &t.name == out) else {
                resolved.push((tensor.clone(), Some(Absent::Unset { step, output: k })));
                continue;
            };
            let mut t = t.clone();
            t.name = tensor.clone();
            self.batch.insert(tensor.clone(), self.step_batch[step]);
            self.tensors.insert(tensor.clone(), t);
            resolved.push((tensor.clone(), None));
        }
        let calls = self.release(resolved);
        self.progress(calls)
    }

    /// Settles each tensor as produced (`None`) or absent (`Some(why)`) and returns the steps
    /// that became ready. A step whose last input settles with a required one absent is
    /// skipped, which settles its outputs as absent in turn (the plan is acyclic, so this
    /// ends).
    fn release(&mut self, mut work: Vec<(String, Option<Absent>)>) -> Vec<StepCall> {
        let mut calls = Vec::new();
        let plan = self.plan.clone();
        while let Some((name, why)) = work.pop() {
            let absent = why.is_some();
            if let Some(why) = why {
                self.absent.insert(name.clone(), why);
            }
            // one entry per input reading `name`: a step reading it twice is listed twice
            let consumers = plan.consumers.get(&name).map_or(&[][..], Vec::as_slice);
            for (k, &n) in consumers.iter().enumerate() {
                if consumers[..k].contains(&n) {
                    continue;
                }
                for (i, (input, tensor)) in plan.steps[n].inputs.iter().enumerate() {
                    if *tensor != name {
                        continue;
                    }
                    let Some(left) = self.missing[n].checked_sub(1) else {
                        continue;
                    };
                    self.missing[n] = left;
                    if absent && self.blocked[n].is_none() && !plan.optional(n, input) {
                        self.blocked[n] = Some(i);
                    }
                }
                if self.missing[n] > 0 || !self.needed[n] {
                    continue;
                }
                match self.blocked[n] {
                    None => calls.push(self.call(n)),
                    Some(input) => {
                        self.skipped.push(n);
                        for (_, tensor) in &plan.steps[n].outputs {
                            work.push((tensor.clone(), Some(Absent::Skipped { step: n, input })));
                        }
                    }
                }
            }
        }
        calls
    }

    /// Why tensor `name` is absent, in words, following skips back to where they began.
    fn explain(&self, name: &str) -> String {
        let steps = &self.plan.steps;
        match self.absent.get(name) {
            None => format!("'{name}' was not produced"),
            Some(Absent::NotSent) => format!("the request has no input '{name}'"),
            Some(&Absent::Unset { step, output }) => format!(
                "{} did not produce its output '{}'",
                steps[step].label(step),
                steps[step].outputs[output].0
            ),
            Some(&Absent::Skipped { step, input }) => {
                let (input, tensor) = &steps[step].inputs[input];
                format!(
                    "{} did not run: its input '{input}' was not produced ({})",
                    steps[step].label(step),
                    self.explain(tensor)
                )
            }
        }
    }

    fn batch_of(&self, tensor: &str) -> usize {
        self.batch.get(tensor).copied().unwrap_or(0)
    }

    fn call(&mut self, n: usize) -> StepCall {
        let s = &self.plan.steps[n];
        let shapes = self.plan.shapes.as_ref().map(|p| &p.steps[n]);
        let mut request = self.template.clone();
        // an absent input here is an optional one (a required one would have skipped the step)
        request.inputs = s
            .inputs
            .iter()
            .filter(|(_, tensor)| self.tensors.contains_key(tensor))
            .map(|(input, tensor)| {
                let mut t = self.tensors[tensor].clone();
                t.name = input.clone();
                if let Some(dims) = shapes.and_then(|sh| sh.dims.get(input)) {
                    let batching = shapes.is_some_and(|sh| sh.batching);
                    t.shape = reshape(dims, batching, self.batch_of(tensor), &t.shape);
                }
                t
            })
            .collect();
        // As Triton counts it: a batching model's request has the batch of its first input.
        self.step_batch[n] = match (shapes, request.inputs.first()) {
            (Some(sh), Some(t)) if sh.batching => t
                .shape
                .first()
                .and_then(|&b| usize::try_from(b).ok())
                .unwrap_or(0),
            _ => 0,
        };
        request.requested_outputs = s.outputs.iter().map(|(o, _)| o.clone()).collect();
        StepCall { step: n, request }
    }

    fn progress(&mut self, calls: Vec<StepCall>) -> Progress {
        self.outstanding += calls.len();
        if self.outstanding > 0 {
            return Progress::Continue(calls);
        }
        self.done = true;
        let mut outputs = Vec::with_capacity(self.answer.len());
        for o in &self.answer {
            match self.tensors.get(o) {
                Some(t) => {
                    let mut t = t.clone();
                    if let Some(sh) = self.plan.shapes.as_ref().map(|p| &p.ensemble) {
                        if let Some(dims) = sh.dims.get(o) {
                            t.shape = reshape(dims, sh.batching, self.batch_of(o), &t.shape);
                        }
                    }
                    outputs.push(t)
                }
                // Not produced: an error when the client named it, else simply left out.
                None => match self.absent.get(o) {
                    Some(_) if !self.named => {}
                    Some(_) => {
                        return Progress::Done(Err(Error::invalid(format!(
                            "ensemble '{}': output '{o}' was not produced: {}",
                            self.plan.name,
                            self.explain(o)
                        ))))
                    }
                    None => {
                        return Progress::Done(Err(Error::internal(format!(
                            "ensemble '{}': output '{o}' was never produced (a step it depends on did not run)",
                            self.plan.name
                        ))))
                    }
                },
            }
        }
        Progress::Done(Ok(InferResponse::new(outputs)))
    }
}

#[cfg(test)]
mod tests;
