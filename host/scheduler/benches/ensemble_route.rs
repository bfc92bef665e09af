//! What a branch that does not run costs the ensemble scheduler: the DAG state machine alone
//! (no server, no models), driving one request through `file_route`'s shape:
//!
//! `IN → type → LABEL; IN, LABEL → route → {TEXT | IMAGE}; TEXT → embed → EMBEDDING;
//! IMAGE → direction → DIRECTION`
//!
//! - **routed**: the router sets `TEXT` only, so `direction` is skipped;
//! - **unconditional**: the router sets both, so both branches are scheduled (their compute
//!   is not in this figure: models answer at once);
//! - **taken branch only**: a plan without the image branch at all, the floor.
//!
//! routed − taken-only is the scheduling cost of the branch not taken (the goal is
//! ≤ 5 µs and zero compute: a skipped step never reaches its model's queue). Each figure is
//! the median over rounds of the mean time per request of `--requests` requests; the cases
//! take turns within each round.
//!
//! `cargo bench -p wisp-scheduler --bench ensemble_route -- [--rounds N] [--requests N]`, or
//! `./dev bench route` (which also runs the end-to-end figures in `benches/route.py`).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use wisp_core::config::ensemble::EnsembleStep;
use wisp_core::{DataType, InferRequest, InferResponse, Tensor};
use wisp_scheduler::ensemble::{Plan, Progress, Run};

fn step(model: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> EnsembleStep {
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    EnsembleStep {
        model: model.into(),
        version: None,
        inputs: pairs(inputs),
        outputs: pairs(outputs),
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn plan(with_image_branch: bool) -> Arc<Plan> {
    let mut steps = vec![
        step("type", &[("CONTENT", "IN")], &[("LABEL", "LABEL")]),
        step(
            "route",
            &[("CONTENT", "IN"), ("LABEL", "LABEL")],
            if with_image_branch {
                &[("TEXT", "text"), ("IMAGE", "image")]
            } else {
                &[("TEXT", "text")]
            },
        ),
        step("embed", &[("TEXT", "text")], &[("EMBEDDING", "EMBEDDING")]),
    ];
    let mut outputs = vec!["LABEL", "EMBEDDING"];
    if with_image_branch {
        steps.push(step(
            "direction",
            &[("IMAGE", "image")],
            &[("DIRECTION", "DIRECTION")],
        ));
        outputs.push("DIRECTION");
    }
    Arc::new(Plan::new("file_route", &names(&["IN"]), &names(&outputs), steps).unwrap())
}

fn tensor(name: &str) -> Tensor {
    Tensor::new(name, DataType::Fp32, vec![1], Bytes::from_static(&[0; 4])).unwrap()
}

/// One request through `plan`; the router answers the outputs in `set`. Returns the steps run.
fn one(plan: &Arc<Plan>, set: &[&str]) -> usize {
    let request = InferRequest {
        inputs: vec![tensor("IN")],
        ..Default::default()
    };
    let (mut run, mut progress) = Run::start(plan.clone(), request);
    let mut queue = Vec::new();
    let mut ran = 0;
    loop {
        match progress {
            Progress::Done(r) => {
                r.expect("the run succeeds");
                return ran;
            }
            Progress::Continue(calls) => queue.extend(calls),
        }
        let call = queue.pop().expect("a call in flight");
        ran += 1;
        let outputs = plan.steps()[call.step]
            .outputs
            .iter()
            .filter(|(o, _)| call.step != 1 || set.contains(&o.as_str()))
            .map(|(o, _)| tensor(o))
            .collect();
        progress = run.complete(call.step, Ok(InferResponse::new(outputs)));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (mut rounds, mut requests) = (15usize, 20_000usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| (1..=100).contains(&n))
                    .expect("--rounds takes 1..=100");
            }
            "--requests" => {
                requests = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| (1..=1_000_000).contains(&n))
                    .expect("--requests takes 1..=1000000");
            }
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    let full = plan(true);
    let taken_only = plan(false);
    let cases: [(&str, &Arc<Plan>, &[&str], usize); 3] = [
        ("routed (image branch skipped)", &full, &["TEXT"], 3),
        (
            "unconditional (both branches)",
            &full,
            &["TEXT", "IMAGE"],
            4,
        ),
        (
            "taken branch only (no image branch)",
            &taken_only,
            &["TEXT"],
            3,
        ),
    ];
    for (name, plan, set, steps) in cases {
        assert_eq!(one(plan, set), steps, "{name}: steps run");
    }
    // The cases take turns within each round, so that a noisy moment on a shared machine
    // falls on all of them; the first round warms up and is discarded.
    let mut per_round: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); cases.len()];
    for round in 0..=rounds {
        for (c, (_, plan, set, _)) in cases.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..requests {
                std::hint::black_box(one(plan, set));
            }
            if round > 0 {
                per_round[c].push(start.elapsed().as_nanos() as f64 / requests as f64 / 1000.0);
            }
        }
    }
    let medians: Vec<(&str, usize, f64)> = cases
        .iter()
        .zip(per_round)
        .map(|((name, _, _, steps), v)| (*name, *steps, median(v)))
        .collect();
    println!("| plan | steps run | µs per request (median of {rounds} rounds × {requests}) |");
    println!("|---|---|---|");
    for (name, steps, us) in &medians {
        println!("| {name} | {steps} | {us:.2} |");
    }
    let (routed, floor) = (medians[0].2, medians[2].2);
    println!(
        "\nScheduling cost of the branch not taken: {:.2} µs per request (routed − taken only); \
         its compute: none (the skipped step is never sent to its model).",
        routed - floor
    );
}
