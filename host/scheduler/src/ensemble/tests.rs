//! The DAG state machine driven by hand, and Triton's batch conversion.
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
    let (r, widest, _) = drive_wanting(plan, input, fail, &[]);
    (r, widest)
}

/// As [`drive`], asking for the outputs `wanted` only; also returns the steps that ran.
fn drive_wanting(
    plan: Plan,
    input: f32,
    fail: &[usize],
    wanted: &[&str],
) -> (Result<InferResponse>, usize, Vec<usize>) {
    let plan = Arc::new(plan);
    let req = InferRequest {
        inputs: vec![tensor("IN", input)],
        requested_outputs: names(wanted),
        ..Default::default()
    };
    let mut ran = Vec::new();
    let (mut run, mut progress) = Run::start(plan.clone(), req);
    let mut queue: Vec<StepCall> = Vec::new();
    let mut widest = 0;
    loop {
        match progress {
            Progress::Done(r) => return (r, widest, ran),
            Progress::Continue(calls) => queue.extend(calls),
        }
        widest = widest.max(queue.len());
        let call = queue
            .pop()
            .expect("a run that is not done has calls in flight");
        let s = &plan.steps()[call.step];
        ran.push(call.step);
        let result = if fail.contains(&call.step) {
            Err(Error::unavailable("model is not ready"))
        } else {
            let sum: f32 = call.request.inputs.iter().map(value).sum();
            Ok(InferResponse::new(
                s.outputs
                    .iter()
                    .map(|(o, _)| tensor(o, sum + call.step as f32 + 1.0))
                    .collect(),
            ))
        };
        progress = run.complete(call.step, result);
    }
}

#[test]
fn steps_no_requested_output_needs_do_not_run() {
    // IN -> 0 -> a -> 1 -> OUT_A ; IN -> 2 -> OUT_B
    let plan = || {
        Plan::new(
            "e",
            &names(&["IN"]),
            &names(&["OUT_A", "OUT_B"]),
            vec![
                step("m0", &[("x", "IN")], &[("y", "a")]),
                step("m1", &[("x", "a")], &[("y", "OUT_A")]),
                step("m2", &[("x", "IN")], &[("y", "OUT_B")]),
            ],
        )
        .unwrap()
    };
    let (r, _, mut ran) = drive_wanting(plan(), 1.0, &[], &["OUT_B"]);
    let r = r.unwrap();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(
        (r.outputs[0].name.as_str(), value(&r.outputs[0])),
        ("OUT_B", 4.0)
    );
    assert_eq!(ran, [2]);
    let (r, _, _) = drive_wanting(plan(), 1.0, &[], &["OUT_A"]);
    assert_eq!(r.unwrap().outputs[0].name, "OUT_A");
    let (r, _, _) = drive_wanting(plan(), 1.0, &[], &[]);
    assert_eq!(r.unwrap().outputs.len(), 2);
    (_, _, ran) = drive_wanting(plan(), 1.0, &[], &["OUT_A", "OUT_B"]);
    ran.sort();
    assert_eq!(ran, [0, 1, 2]);
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
        e.message().contains("ensemble 'e' step 1 ('model')") && e.message().contains("not ready"),
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
        m.contains("step 1 ('b'): output 'y' maps to 'mid', which step 0 ('a') already produces"),
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
fn a_step_reading_one_tensor_twice_runs_once() {
    // Triton's "fan" ensembles feed a nop the same tensor as both of its inputs
    let plan = Plan::new(
        "fan",
        &names(&["IN"]),
        &names(&["OUT"]),
        vec![
            step("a", &[("x", "IN")], &[("y", "mid")]),
            step("nop", &[("x0", "mid"), ("x1", "mid")], &[("y", "OUT")]),
        ],
    )
    .unwrap();
    let (r, _, ran) = drive_wanting(plan, 1.0, &[], &[]);
    // a: 1 + 1 = 2; nop: 2 + 2 + 2 = 6
    assert_eq!(value(&r.unwrap().outputs[0]), 6.0);
    assert_eq!(ran, vec![0, 1]);
}

#[test]
fn reshape_follows_tritons_batch_conversion() {
    // (receiver dims, receiver batches, producer batch, shape) -> shape
    type Case = (&'static [i64], bool, usize, &'static [i64], &'static [i64]);
    let cases: &[Case] = &[
        // from a non-batching context into a batching model: gains a batch of 1 …
        (&[-1], true, 0, &[16], &[1, 16]),
        (&[-1], true, 0, &[0], &[1, 0]),
        // … unless it is already shaped as a batch
        (&[16], true, 0, &[3, 16], &[3, 16]),
        // from a batch of 1 into a non-batching model: loses it …
        (&[16], false, 1, &[1, 16], &[16]),
        (&[-1], false, 1, &[1, 0], &[0]),
        // … unless it fits as one tensor, or the batch is larger
        (&[-1, 16], false, 1, &[1, 16], &[1, 16]),
        (&[16], false, 3, &[3, 16], &[3, 16]),
        // same kind on both sides: unchanged
        (&[16], true, 4, &[4, 16], &[4, 16]),
        (&[-1, 16], false, 0, &[2, 16], &[2, 16]),
    ];
    for &(to, batching, batch, dims, want) in cases {
        assert_eq!(
            reshape(to, batching, batch, dims),
            want,
            "{to:?} {batching} {batch} {dims:?}"
        );
    }
}

#[test]
fn a_non_batching_ensemble_passes_through_batching_and_non_batching_steps() {
    // Triton's QA "sequence" ensemble: nop (batching, [-1]) then a non-batching model
    // ([16]); the ensemble (non-batching, [16]) also answers with the nop's own output.
    let shapes = |batching: bool, pairs: &[(&str, &[i64])]| Shapes {
        batching,
        dims: pairs
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_vec()))
            .collect(),
    };
    let plan = Plan::new(
        "seq",
        &names(&["IN"]),
        &names(&["OUT", "SAME"]),
        vec![
            step("nop", &[("INPUT0", "IN")], &[("OUTPUT0", "SAME")]),
            step("nobatch", &[("x", "SAME")], &[("y", "OUT")]),
        ],
    )
    .unwrap()
    .with_shapes(
        shapes(false, &[("OUT", &[16]), ("SAME", &[16])]),
        vec![
            shapes(true, &[("INPUT0", &[-1])]),
            shapes(false, &[("x", &[16])]),
        ],
    )
    .unwrap();
    let plan = Arc::new(plan);
    let t = |name: &str, shape: Vec<i64>| {
        Tensor::new(name, DataType::Fp32, shape, Bytes::from(vec![0u8; 64])).unwrap()
    };
    let req = InferRequest {
        inputs: vec![t("IN", vec![16])],
        ..Default::default()
    };
    let (mut run, progress) = Run::start(plan.clone(), req);
    let Progress::Continue(calls) = progress else {
        panic!("the nop step runs first")
    };
    assert_eq!(calls[0].request.inputs[0].shape, vec![1, 16]);
    let progress = run.complete(0, Ok(InferResponse::new(vec![t("OUTPUT0", vec![1, 16])])));
    let Progress::Continue(calls) = progress else {
        panic!("the non-batching step runs next")
    };
    assert_eq!(calls[0].request.inputs[0].shape, vec![16]);
    let progress = run.complete(1, Ok(InferResponse::new(vec![t("y", vec![16])])));
    let Progress::Done(Ok(r)) = progress else {
        panic!("the run finishes")
    };
    let shape = |n: &str| {
        r.outputs
            .iter()
            .find(|o| o.name == n)
            .unwrap()
            .shape
            .clone()
    };
    assert_eq!(shape("OUT"), vec![16]);
    assert_eq!(
        shape("SAME"),
        vec![16],
        "the nop's batch of 1 leaves the ensemble"
    );
}
