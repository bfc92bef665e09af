//! `platform: "ensemble"`: Triton's `ensemble_scheduling` run as an event-driven DAG.
//!
//! An ensemble is a model like any other (its own queue, statistics and metrics); its
//! instances drive [`wisp_scheduler::ensemble::Run`]s: every request of a batch starts at
//! once, each ready step goes to its composing model's scheduler (so it batches with the
//! other requests and with outside traffic), and a completion releases the steps waiting on
//! it. An instance thread only waits; [`ENSEMBLE_DEFAULT_INSTANCES`] of them let that many
//! batches be in the pipeline at once.
//!
//! [`ENSEMBLE_DEFAULT_INSTANCES`]: wisp_core::config::ENSEMBLE_DEFAULT_INSTANCES

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

use wisp_core::backend::{Backend, ExecTiming, Instance, LoadedModel};
use wisp_core::config::{ModelIo, ModelSpec, Signature};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result};
use wisp_scheduler::ensemble::{Plan, Progress, Run, Shapes, Step};

use super::caller::StepCaller;

/// Loads ensembles (their composing models must already be loaded).
pub struct EnsembleBackend {
    caller: Arc<dyn StepCaller>,
}

impl EnsembleBackend {
    /// Ensembles whose steps reach models through `caller` (the registry's
    /// [`RegistryCaller`](super::caller::RegistryCaller) when served).
    pub fn new(caller: Arc<dyn StepCaller>) -> Self {
        EnsembleBackend { caller }
    }
}

/// A tensor's datatype and dims (without the batch dim) as a config declares them, and whether
/// the model that declares them batches.
#[derive(Clone)]
struct Spec {
    datatype: DataType,
    dims: Vec<i64>,
    batching: bool,
    from: String,
}

impl Spec {
    /// The full shape a request carries: `[-1, dims…]` for a batching model.
    fn full_dims(&self) -> Vec<i64> {
        let batch = self.batching.then_some(-1);
        batch.into_iter().chain(self.dims.iter().copied()).collect()
    }

    /// Triton's rule: the dims match (`-1` matching anything), or the full shapes do, so that a
    /// batching model's `[16]` meets a non-batching model's `[-1, 16]`: the same tensor, its
    /// first dimension read as the batch on one side and as data on the other.
    fn compatible(&self, other: &Spec) -> bool {
        dims_compatible(&self.dims, &other.dims)
            || dims_compatible(&self.full_dims(), &other.full_dims())
    }
}

fn dims_compatible(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x < 0 || y < 0 || x == y)
}

/// Checks every mapping against the composing models' signatures; returns every problem, or
/// the shapes the batch conversion between steps needs (see [`wisp_scheduler::ensemble::reshape`]).
fn check_types(sig: &Signature, steps: &[Step], caller: &dyn StepCaller) -> Result<Vec<Shapes>> {
    let mut errs = Vec::new();
    let mut known: HashMap<String, Spec> = sig
        .inputs
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                Spec {
                    datatype: i.datatype,
                    dims: i.dims.clone(),
                    batching: sig.batches(),
                    from: format!("ensemble input '{}'", i.name),
                },
            )
        })
        .collect();
    let mut signatures = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let version = s.version.map(|v| v.to_string());
        match caller.signature(&s.model, version.as_deref()) {
            Ok(c) => {
                // A non-batching model takes whatever the ensemble's batch is, as data.
                if c.max_batch_size != 0 && c.max_batch_size < sig.max_batch_size {
                    errs.push(format!(
                        "{}: ensemble {} allows maximum batch size {}, but it contains model {} \
                         which only allows maximum batch size to be {}",
                        s.label(n),
                        sig.model,
                        sig.max_batch_size,
                        s.model,
                        c.max_batch_size
                    ));
                }
                for (out, tensor) in &s.outputs {
                    match c.output(out) {
                        Some(o) => {
                            known.insert(
                                tensor.clone(),
                                Spec {
                                    datatype: o.datatype,
                                    dims: o.dims.clone(),
                                    batching: c.batches(),
                                    from: format!("{} output '{out}'", s.label(n)),
                                },
                            );
                        }
                        None => errs.push(format!(
                            "{}: the model has no output '{out}' (outputs: {})",
                            s.label(n),
                            c.output_names()
                        )),
                    }
                }
                signatures.push(Some(c));
            }
            Err(e) => {
                errs.push(format!("{}: {}", s.label(n), e.message()));
                signatures.push(None);
            }
        }
    }
    for (n, (s, c)) in steps.iter().zip(&signatures).enumerate() {
        let Some(c) = c else { continue };
        for (input, tensor) in &s.inputs {
            let Some(i) = c.input(input) else {
                errs.push(format!(
                    "{}: the model has no input '{input}' (inputs: {})",
                    s.label(n),
                    c.input_names()
                ));
                continue;
            };
            let Some(spec) = known.get(tensor) else {
                continue;
            };
            if spec.datatype != i.datatype {
                errs.push(format!(
                    "{}: input '{input}' is {} but '{tensor}' ({}) is {}",
                    s.label(n),
                    i.datatype.config_name(),
                    spec.from,
                    spec.datatype.config_name()
                ));
            } else if !spec.compatible(&Spec {
                datatype: i.datatype,
                dims: i.dims.clone(),
                batching: c.batches(),
                from: String::new(),
            }) {
                errs.push(format!(
                    "{}: input '{input}' has dims {:?} but '{tensor}' ({}) has {:?}",
                    s.label(n),
                    i.dims,
                    spec.from,
                    spec.dims
                ));
            }
        }
    }
    for o in &sig.outputs {
        if let Some(spec) = known.get(&o.name) {
            if spec.datatype != o.datatype {
                errs.push(format!(
                    "ensemble output '{}' is {} but {} is {}",
                    o.name,
                    o.datatype.config_name(),
                    spec.from,
                    spec.datatype.config_name()
                ));
            } else if !spec.compatible(&Spec {
                datatype: o.datatype,
                dims: o.dims.clone(),
                batching: sig.batches(),
                from: String::new(),
            }) {
                errs.push(format!(
                    "ensemble output '{}' has dims {:?} but {} has {:?}",
                    o.name, o.dims, spec.from, spec.dims
                ));
            }
        }
    }
    if errs.is_empty() {
        Ok(signatures
            .iter()
            .flatten()
            .map(|c| Shapes {
                batching: c.batches(),
                dims: c
                    .inputs
                    .iter()
                    .map(|i| (i.name.clone(), i.dims.clone()))
                    .collect(),
                optional: c
                    .inputs
                    .iter()
                    .filter(|i| i.optional)
                    .map(|i| i.name.clone())
                    .collect(),
            })
            .collect())
    } else {
        Err(Error::invalid(format!(
            "ensemble '{}': {}",
            sig.model,
            errs.join("; ")
        )))
    }
}

impl Backend for EnsembleBackend {
    fn describe(&self, _model_file: &Path) -> Result<ModelIo> {
        Err(Error::unsupported(
            "an ensemble declares its inputs and outputs in config.pbtxt",
        ))
    }

    fn load(&self, spec: &ModelSpec, _model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        let config = &*spec.config;
        // Read and checked (a DAG) when the config was validated.
        let steps = spec.steps.to_vec();
        let inputs: Vec<String> = config.input.iter().map(|i| i.name.clone()).collect();
        let outputs: Vec<String> = config.output.iter().map(|o| o.name.clone()).collect();
        let plan = Plan::new(&config.name, &inputs, &outputs, steps)?;
        let step_shapes = check_types(&spec.signature, plan.steps(), &*self.caller)?;
        let sig = &spec.signature;
        let ensemble_shapes = Shapes {
            batching: sig.batches(),
            dims: sig
                .outputs
                .iter()
                // Triton shapes an ensemble output by its `reshape` when it has one
                .map(|o| (o.name.clone(), o.reshape.clone().unwrap_or(o.dims.clone())))
                .collect(),
            optional: Default::default(),
        };
        let plan = plan.with_shapes(ensemble_shapes, step_shapes)?;
        let labels = producer_labels(plan.steps(), &outputs, &*self.caller);
        let skips = Arc::new(plan.steps().iter().map(|_| AtomicU64::new(0)).collect());
        // Read and bounded when the config was validated.
        let limit =
            wisp_core::config::ensemble::max_inflight_requests(config).map_err(Error::invalid)?;
        if let Some(n) = limit {
            tracing::info!(
                "Ensemble model '{}' configured with max_inflight_requests: {n}",
                config.name
            );
        }
        let inflight = limit.map(|n| Arc::new(plan.steps().iter().map(|_| Gate::new(n)).collect()));
        Ok(Box::new(EnsembleModel {
            name: config.name.as_str().into(),
            plan: Arc::new(plan),
            caller: self.caller.clone(),
            labels,
            skips,
            inflight,
        }))
    }
}

/// For each ensemble output, the labels of the composing model's output that produces it, as
/// loaded now (a composing model reloaded with other labels is seen when the ensemble reloads).
fn producer_labels(
    steps: &[Step],
    outputs: &[String],
    caller: &dyn StepCaller,
) -> Vec<(String, Arc<Vec<String>>)> {
    let mut found = Vec::new();
    for output in outputs {
        let producer = steps.iter().find_map(|s| {
            let (out, _) = s.outputs.iter().find(|(_, tensor)| tensor == output)?;
            Some((s, out))
        });
        let Some((step, out)) = producer else {
            continue;
        };
        let version = step.version.map(|v| v.to_string());
        if let Some(labels) = caller.labels(&step.model, version.as_deref(), out) {
            found.push((output.clone(), labels));
        }
    }
    found
}

struct EnsembleModel {
    name: Arc<str>,
    plan: Arc<Plan>,
    caller: Arc<dyn StepCaller>,
    labels: Vec<(String, Arc<Vec<String>>)>,
    /// Per step: requests that skipped it.
    skips: Arc<Vec<AtomicU64>>,
    /// Per step, with `max_inflight_requests`: the gate its requests pass.
    inflight: Option<Arc<Vec<Gate>>>,
}

/// Triton's `max_inflight_requests` for one step: at most `limit` of the ensemble's requests
/// in flight there at once, whichever of its requests they belong to. The ensemble instance
/// that would send one more waits (its instances only wait anyway); a slot frees when the step
/// answers, on the answering thread, so a waiting instance never waits on itself.
struct Gate {
    limit: usize,
    taken: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    fn new(limit: usize) -> Self {
        Gate {
            limit,
            taken: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a slot at step `step` of `gates`; it is given back when the pass drops.
    fn enter(gates: &Arc<Vec<Gate>>, step: usize) -> Pass {
        let gate = &gates[step];
        let mut taken = gate.taken.lock().expect("gate");
        while *taken >= gate.limit {
            taken = gate.freed.wait(taken).expect("gate");
        }
        *taken += 1;
        Pass {
            gates: gates.clone(),
            step,
        }
    }
}

/// One step request's slot, given back when dropped (answered, refused or dropped unanswered).
struct Pass {
    gates: Arc<Vec<Gate>>,
    step: usize,
}

impl Drop for Pass {
    fn drop(&mut self) {
        let gate = &self.gates[self.step];
        *gate.taken.lock().expect("gate") -= 1;
        gate.freed.notify_one();
    }
}

impl LoadedModel for EnsembleModel {
    fn engine(&self) -> &str {
        "ensemble"
    }

    fn output_labels(&self) -> Vec<(String, Arc<Vec<String>>)> {
        self.labels.clone()
    }

    fn step_skips(&self) -> Vec<(String, u64)> {
        self.plan
            .steps()
            .iter()
            .zip(self.skips.iter())
            .map(|(s, n)| (s.model.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }

    fn new_instance(&self, _index: usize) -> Result<Box<dyn Instance>> {
        Ok(Box::new(EnsembleInstance {
            name: self.name.clone(),
            plan: self.plan.clone(),
            caller: self.caller.clone(),
            skips: self.skips.clone(),
            inflight: self.inflight.clone(),
        }))
    }
}

/// Why calling `model` from `path` (the ensembles and plugins a request passed through) would
/// wait on itself, naming the cycle (`a -> b -> a`); `None` when `model` is not on the path.
fn call_cycle(path: &[Arc<str>], model: &str) -> Option<String> {
    let start = path.iter().position(|m| &**m == model)?;
    let mut cycle: Vec<String> = path[start..].iter().map(|m| m.to_string()).collect();
    cycle.push(model.to_string());
    Some(super::cycle::message(&cycle))
}

struct EnsembleInstance {
    /// The ensemble's name, on the call path of its steps' requests.
    name: Arc<str>,
    plan: Arc<Plan>,
    caller: Arc<dyn StepCaller>,
    skips: Arc<Vec<AtomicU64>>,
    inflight: Option<Arc<Vec<Gate>>>,
}

type Completion = (usize, usize, Result<InferResponse>);

impl Instance for EnsembleInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        let (tx, rx) = mpsc::channel::<Completion>();
        let mut runs: Vec<Run> = Vec::with_capacity(batch.len());
        let mut results: Vec<Option<Result<InferResponse>>> = vec![None; batch.len()];
        // Completions known without waiting (a step that could not even be queued).
        let mut immediate: VecDeque<Completion> = VecDeque::new();
        let mut open = batch.len();
        let mut steps_compute = vec![ExecTiming::default(); batch.len()];
        let handle = |i: usize,
                      progress: Progress,
                      results: &mut Vec<Option<Result<InferResponse>>>,
                      immediate: &mut VecDeque<Completion>,
                      open: &mut usize| match progress {
            Progress::Done(r) => {
                if results[i].is_none() {
                    results[i] = Some(r);
                    *open -= 1;
                }
            }
            Progress::Continue(calls) => {
                for mut call in calls {
                    let step = &self.plan.steps()[call.step];
                    let version = step.version.map(|v| v.to_string());
                    let tx = tx.clone();
                    let n = call.step;
                    // a plugin step may not call back into this ensemble
                    call.request.call_path = batch[i].call_path.clone();
                    call.request.call_path.push(self.name.clone());
                    // Nor may a step: it would wait on an instance that waits on it. Loading
                    // refuses such cycles; this holds if one slipped past (a concurrent load).
                    if let Some(cycle) = call_cycle(&call.request.call_path, &step.model) {
                        immediate.push_back((i, n, Err(Error::invalid(cycle))));
                        continue;
                    }
                    // back-pressure: wait for a slot at this step (given back on answer)
                    let pass = self.inflight.as_ref().map(|g| Gate::enter(g, n));
                    if let Err(e) = self.caller.submit(
                        &step.model,
                        version.as_deref(),
                        call.request,
                        Box::new(move |r| {
                            drop(pass);
                            let _ = tx.send((i, n, r));
                        }),
                    ) {
                        immediate.push_back((i, n, Err(e)));
                    }
                }
            }
        };
        for (i, req) in batch.iter().enumerate() {
            let (run, progress) = Run::start(self.plan.clone(), req.clone());
            runs.push(run);
            handle(i, progress, &mut results, &mut immediate, &mut open);
        }
        while open > 0 {
            let (i, step, r) = match immediate.pop_front() {
                Some(c) => c,
                None => match rx.recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            if let Ok(c) = r.as_ref().map(|resp| resp.compute.unwrap_or_default()) {
                steps_compute[i].input_ns += c.input_ns;
                steps_compute[i].infer_ns += c.infer_ns;
                steps_compute[i].output_ns += c.output_ns;
            }
            let progress = runs[i].complete(step, r);
            handle(i, progress, &mut results, &mut immediate, &mut open);
        }
        for run in &runs {
            for &n in run.skipped() {
                if let Some(c) = self.skips.get(n) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The ensemble's compute is its steps' (as Triton reports it), averaged over the batch,
        // since the statistics charge a batch's compute to each of its requests.
        let n = batch.len().max(1) as u64;
        let total = steps_compute
            .iter()
            .fold(ExecTiming::default(), |a, c| ExecTiming {
                input_ns: a.input_ns + c.input_ns,
                infer_ns: a.infer_ns + c.infer_ns,
                output_ns: a.output_ns + c.output_ns,
            });
        *timing = ExecTiming {
            input_ns: total.input_ns / n,
            infer_ns: total.infer_ns / n,
            output_ns: total.output_ns / n,
        };
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::internal(
                        "a composing model dropped a request without answering",
                    ))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_on_its_call_path_names_the_cycle() {
        let path: Vec<Arc<str>> = vec!["outer".into(), "a".into(), "b".into()];
        assert_eq!(
            call_cycle(&path, "a").unwrap(),
            "circular dependency between ensembles: a -> b -> a"
        );
        assert_eq!(call_cycle(&path, "add_sub"), None);
    }
}
