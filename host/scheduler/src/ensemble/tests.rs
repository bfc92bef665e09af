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
        optional: Default::default(),
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

/// Drives `plan` where each step answers every mapped output with `step + 1`, except the
/// outputs in `unset` (step, output name), which it leaves out. Returns the outcome, the steps
/// that ran (in order) and the steps skipped.
fn drive_unset(
    plan: Plan,
    request: InferRequest,
    unset: &[(usize, &str)],
) -> (Result<InferResponse>, Vec<usize>, Vec<usize>) {
    let plan = Arc::new(plan);
    let (mut run, mut progress) = Run::start(plan.clone(), request);
    let mut queue: Vec<StepCall> = Vec::new();
    let mut ran = Vec::new();
    loop {
        match progress {
            Progress::Done(r) => return (r, ran, run.skipped().to_vec()),
            Progress::Continue(calls) => queue.extend(calls),
        }
        let call = queue.remove(0);
        ran.push(call.step);
        let s = &plan.steps()[call.step];
        let outputs = s
            .outputs
            .iter()
            .filter(|(o, _)| !unset.contains(&(call.step, o.as_str())))
            .map(|(o, _)| tensor(o, call.step as f32 + 1.0))
            .collect();
        progress = run.complete(call.step, Ok(InferResponse::new(outputs)));
    }
}

fn request(wanted: &[&str]) -> InferRequest {
    InferRequest {
        inputs: vec![tensor("IN", 0.0)],
        requested_outputs: names(wanted),
        ..Default::default()
    }
}

/// IN -> route -> {TEXT, IMAGE}; TEXT -> embed -> pool -> EMBEDDING; IMAGE -> classify -> CLASS
fn routing() -> Plan {
    Plan::new(
        "route",
        &names(&["IN"]),
        &names(&["EMBEDDING", "CLASS", "KIND"]),
        vec![
            step(
                "router",
                &[("x", "IN")],
                &[("text", "TEXT"), ("image", "IMAGE"), ("kind", "KIND")],
            ),
            step("embed", &[("x", "TEXT")], &[("y", "tokens")]),
            step("pool", &[("x", "tokens")], &[("y", "EMBEDDING")]),
            step("classify", &[("x", "IMAGE")], &[("y", "CLASS")]),
        ],
    )
    .unwrap()
}

#[test]
fn an_unset_output_skips_the_branch_that_needs_it() {
    let (r, ran, skipped) = drive_unset(routing(), request(&[]), &[(0, "image")]);
    let r = r.unwrap();
    let got: Vec<&str> = r.outputs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(got, ["EMBEDDING", "KIND"], "CLASS is simply absent");
    assert_eq!(ran, [0, 1, 2], "the image branch never ran");
    assert_eq!(skipped, [3]);
    // the other way round: the whole two-step text branch is skipped
    let (r, ran, mut skipped) = drive_unset(routing(), request(&[]), &[(0, "text")]);
    let got: Vec<String> = r.unwrap().outputs.into_iter().map(|t| t.name).collect();
    assert_eq!(got, ["CLASS", "KIND"]);
    assert_eq!(ran, [0, 3]);
    skipped.sort();
    assert_eq!(skipped, [1, 2], "a skip passes down the chain");
}

#[test]
fn a_named_output_that_was_not_produced_is_an_error_naming_the_step() {
    let (r, ran, _) = drive_unset(routing(), request(&["CLASS"]), &[(0, "image")]);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::InvalidArg);
    assert_eq!(
        e.message(),
        "ensemble 'route': output 'CLASS' was not produced: step 3 ('classify') did not run: \
         its input 'x' was not produced (step 0 ('router') did not produce its output 'image')"
    );
    assert_eq!(ran, [0], "only what CLASS needs was started");
    let (r, _, _) = drive_unset(routing(), request(&["EMBEDDING"]), &[(0, "text")]);
    let e = r.unwrap_err().message().to_string();
    assert!(
        e.contains("output 'EMBEDDING' was not produced: step 2 ('pool') did not run")
            && e.contains("step 1 ('embed') did not run"),
        "the reason follows the chain back to the router: {e}"
    );
}

#[test]
fn a_step_that_sets_no_output_at_all_answers_nothing_rather_than_hanging() {
    let unset = [(0, "text"), (0, "image"), (0, "kind")];
    let (r, ran, mut skipped) = drive_unset(routing(), request(&[]), &unset);
    assert!(r.unwrap().outputs.is_empty());
    assert_eq!(ran, [0]);
    skipped.sort();
    assert_eq!(skipped, [1, 2, 3]);
}

#[test]
fn a_join_runs_only_when_every_required_input_was_produced() {
    // a diamond whose right arm is cut: the join is skipped, the left arm still answers
    let plan = || {
        Plan::new(
            "diamond",
            &names(&["IN"]),
            &names(&["OUT", "LEFT"]),
            vec![
                step("split", &[("x", "IN")], &[("l", "l"), ("r", "r")]),
                step("left", &[("x", "l")], &[("y", "LEFT")]),
                step("right", &[("x", "r")], &[("y", "rr")]),
                step("join", &[("a", "LEFT"), ("b", "rr")], &[("y", "OUT")]),
            ],
        )
        .unwrap()
    };
    let (r, ran, skipped) = drive_unset(plan(), request(&[]), &[(0, "r")]);
    let got: Vec<String> = r.unwrap().outputs.into_iter().map(|t| t.name).collect();
    assert_eq!(got, ["LEFT"]);
    assert_eq!((ran, skipped), (vec![0, 1], vec![2, 3]));
}

#[test]
fn an_optional_input_is_passed_as_absent() {
    // the join declares 'b' optional, and one step's only input is optional too
    let plan = Plan::new(
        "opt",
        &names(&["IN"]),
        &names(&["OUT", "ALONE"]),
        vec![
            step("split", &[("x", "IN")], &[("l", "l"), ("r", "r")]),
            step("join", &[("a", "l"), ("b", "r")], &[("y", "OUT")]),
            step("alone", &[("b", "r")], &[("y", "ALONE")]),
        ],
    )
    .unwrap();
    let optional = |names: &[&str]| Shapes {
        optional: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let plan = plan
        .with_shapes(
            Shapes::default(),
            vec![optional(&[]), optional(&["b"]), optional(&["b"])],
        )
        .unwrap();
    let plan = Arc::new(plan);
    let (mut run, progress) = Run::start(plan.clone(), request(&[]));
    let Progress::Continue(calls) = progress else {
        panic!("split runs")
    };
    assert_eq!(calls.len(), 1);
    let Progress::Continue(mut calls) =
        run.complete(0, Ok(InferResponse::new(vec![tensor("l", 1.0)])))
    else {
        panic!("both steps run without 'r'")
    };
    calls.sort_by_key(|c| c.step);
    let inputs =
        |c: &StepCall| -> Vec<String> { c.request.inputs.iter().map(|t| t.name.clone()).collect() };
    assert_eq!(
        inputs(&calls[0]),
        ["a"],
        "the absent optional input is left out"
    );
    assert!(
        inputs(&calls[1]).is_empty(),
        "a step whose only input is absent still runs"
    );
    assert!(run.skipped().is_empty());
}

#[test]
fn an_ensemble_input_the_request_leaves_out_is_absent() {
    let plan = Plan::new(
        "e",
        &names(&["IN", "HINT"]),
        &names(&["OUT", "HINTED"]),
        vec![
            step("a", &[("x", "IN")], &[("y", "OUT")]),
            step("b", &[("x", "HINT")], &[("y", "HINTED")]),
        ],
    )
    .unwrap();
    let (r, ran, skipped) = drive_unset(plan, request(&[]), &[]);
    let got: Vec<String> = r.unwrap().outputs.into_iter().map(|t| t.name).collect();
    assert_eq!((got, ran, skipped), (names(&["OUT"]), vec![0], vec![1]));
}
