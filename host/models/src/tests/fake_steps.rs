//! The ensemble backend over a fake [`StepCaller`]: the DAG, its type checks and its error
//! paths, with no registry, scheduler or engine behind the steps.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use wisp_core::backend::{Backend, ExecTiming};
use wisp_core::config::{self, ModelSpec, Signature};
use wisp_core::{Error, InferRequest, InferResponse, Result, Tensor};

use crate::caller::StepCaller;
use crate::ensemble::EnsembleBackend;

/// Composing models computed here: `double` (Y = 2·X) and `inc` (Y = X + 1, refusing a
/// negative X), both FP32 `[-1, 4]`. Answers come from another thread, as a scheduler's do.
#[derive(Default)]
struct FakeSteps {
    signatures: HashMap<String, Arc<Signature>>,
    /// (model, the request's call path) per submitted step request.
    calls: Mutex<Vec<(String, Vec<String>)>>,
    /// Refuse every request at submit, as the registry does for a model unloaded since.
    refuse: bool,
    /// `inc` answers after this long (a consumer slower than its producer).
    slow_inc: Option<std::time::Duration>,
    /// `inc` requests submitted and not yet answered, and the most there ever were.
    inc_inflight: Arc<AtomicUsize>,
    inc_peak: Arc<AtomicUsize>,
}

fn spec(name: &str, text: &str) -> ModelSpec {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config::parse_pbtxt(name, text).unwrap();
    config::normalize(&mut cfg, name, dir.path());
    config::validate(cfg, name, dir.path()).unwrap()
}

const STEP: &str = r#"platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]"#;

impl FakeSteps {
    fn new() -> Arc<Self> {
        Arc::new(Self::serving())
    }

    fn serving() -> Self {
        let mut fake = FakeSteps::default();
        for name in ["double", "inc"] {
            let s = spec(name, STEP);
            fake.signatures.insert(name.into(), s.signature.clone());
        }
        fake
    }
}

impl StepCaller for FakeSteps {
    fn signature(&self, model: &str, _: Option<&str>) -> Result<Arc<Signature>> {
        self.signatures.get(model).cloned().ok_or_else(|| {
            Error::not_found(format!("Request for unknown model: '{model}' is not found"))
        })
    }

    fn labels(&self, _: &str, _: Option<&str>, _: &str) -> Option<Arc<Vec<String>>> {
        None
    }

    fn submit(
        &self,
        model: &str,
        _: Option<&str>,
        request: InferRequest,
        respond: wisp_scheduler::Responder,
    ) -> Result<()> {
        if self.refuse {
            return Err(Error::unavailable(format!("model '{model}' is unloading")));
        }
        let path = request.call_path.iter().map(|m| m.to_string()).collect();
        self.calls.lock().unwrap().push((model.to_string(), path));
        let x = &request.inputs[0];
        let values: Vec<f32> = x.values()?;
        let y: Result<Vec<f32>> = match model {
            "double" => Ok(values.iter().map(|v| v * 2.0).collect()),
            _ if values.iter().any(|v| *v < 0.0) => {
                Err(Error::invalid("inc refuses a negative input"))
            }
            _ => Ok(values.iter().map(|v| v + 1.0).collect()),
        };
        let shape = x.shape.clone();
        let slow = (model == "inc").then_some(self.slow_inc).flatten();
        let (inflight, peak) = (self.inc_inflight.clone(), self.inc_peak.clone());
        if model == "inc" {
            let now = inflight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
        }
        let is_inc = model == "inc";
        std::thread::spawn(move || {
            if let Some(d) = slow {
                std::thread::sleep(d);
            }
            if is_inc {
                inflight.fetch_sub(1, Ordering::SeqCst);
            }
            respond(y.and_then(|y| {
                Ok(InferResponse::new(vec![Tensor::from_values(
                    "Y", shape, &y,
                )?]))
            }))
        });
        Ok(())
    }
}

fn pipeline(first: &str) -> ModelSpec {
    limited_pipeline(first, "")
}

/// `pipeline` with `extra` inside `ensemble_scheduling` (`max_inflight_requests: N`).
fn limited_pipeline(first: &str, extra: &str) -> ModelSpec {
    spec(
        "pipe",
        &format!(
            r#"platform: "ensemble" max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ {extra} step [
  {{ model_name: "{first}" model_version: -1
     input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "mid" }} }},
  {{ model_name: "inc" model_version: -1
     input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "OUT" }} }}
] }}"#
        ),
    )
}

fn request(v: f32) -> InferRequest {
    InferRequest {
        inputs: vec![Tensor::from_values("IN", vec![1, 4], &[v; 4]).unwrap()],
        ..Default::default()
    }
}

#[test]
fn steps_run_in_order_and_each_request_gets_its_own_answer() {
    let fake = FakeSteps::new();
    let backend = EnsembleBackend::new(fake.clone());
    let model = backend.load(&pipeline("double"), Path::new("")).unwrap();
    let mut instance = model.new_instance(0).unwrap();
    let out = instance.execute(
        &[request(1.0), request(-3.0), request(5.0)],
        &mut ExecTiming::default(),
    );
    let values = |r: &Result<InferResponse>| -> Vec<f32> {
        let r = r.as_ref().unwrap();
        assert_eq!(
            r.outputs[0].name, "OUT",
            "the step's Y is renamed by the output map"
        );
        r.outputs[0].values().unwrap()
    };
    assert_eq!(values(&out[0]), vec![3.0; 4], "2·1 + 1");
    assert_eq!(values(&out[2]), vec![11.0; 4], "2·5 + 1");
    let e = out[1].as_ref().unwrap_err();
    assert!(e.message().contains("inc refuses a negative input"), "{e}");

    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        6,
        "two steps for each of three requests: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|(m, _)| m == "double").count(), 3);
    assert!(
        calls.iter().all(|(_, path)| path == &["pipe".to_string()]),
        "each step's request carries the ensemble on its call path (no cycle can wait on it): {calls:?}"
    );
}

#[test]
fn a_step_the_caller_does_not_serve_fails_the_load_naming_the_step() {
    let backend = EnsembleBackend::new(FakeSteps::new());
    let e = backend
        .load(&pipeline("missing"), Path::new(""))
        .err()
        .expect("no such composing model");
    assert!(e.message().contains("missing"), "{e}");
    assert!(
        e.message().contains("is not found"),
        "the caller's reason is kept: {e}"
    );
}

#[test]
fn a_step_refused_at_submit_answers_its_request_without_waiting() {
    let backend = EnsembleBackend::new(Arc::new(FakeSteps {
        refuse: true,
        ..FakeSteps::serving()
    }));
    let model = backend.load(&pipeline("double"), Path::new("")).unwrap();
    let mut instance = model.new_instance(0).unwrap();
    let out = instance.execute(&[request(1.0)], &mut ExecTiming::default());
    let e = out[0].as_ref().unwrap_err();
    assert!(e.message().contains("model 'double' is unloading"), "{e}");
}

/// Triton's back-pressure (`max_inflight_requests`, shared by the ensemble's requests): a
/// producer step (`double`, instant) far faster than its consumer (`inc`, 20 ms) never has
/// more than the limit of requests waiting at the consumer, however many ensemble requests
/// are in flight at once; without the limit all of them pile up there.
#[test]
fn max_inflight_requests_bounds_what_waits_at_a_slow_step() {
    for (extra, bound) in [("max_inflight_requests: 2", Some(2)), ("", None)] {
        let fake = Arc::new(FakeSteps {
            slow_inc: Some(std::time::Duration::from_millis(20)),
            ..FakeSteps::serving()
        });
        let backend = EnsembleBackend::new(fake.clone());
        let model = backend
            .load(&limited_pipeline("double", extra), Path::new(""))
            .unwrap();
        // two ensemble instances share the limit, each with a batch of 8
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let mut instance = model.new_instance(t).unwrap();
                std::thread::spawn(move || {
                    let batch: Vec<_> = (0..8).map(|i| request(i as f32)).collect();
                    instance.execute(&batch, &mut ExecTiming::default())
                })
            })
            .collect();
        for t in threads {
            for (i, r) in t.join().unwrap().iter().enumerate() {
                let v: Vec<f32> = r.as_ref().unwrap().outputs[0].values().unwrap();
                assert_eq!(v, vec![2.0 * i as f32 + 1.0; 4], "every answer is right");
            }
        }
        let peak = fake.inc_peak.load(Ordering::SeqCst);
        match bound {
            Some(n) => assert!(peak <= n, "{peak} in flight at the slow step, limit {n}"),
            None => assert!(peak > 2, "without a limit they pile up: {peak}"),
        }
        assert_eq!(fake.inc_inflight.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn max_inflight_requests_is_bounded_at_load() {
    let text = |v: &str| {
        format!(
            r#"platform: "ensemble" max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ max_inflight_requests: {v} step [
  {{ model_name: "inc" model_version: -1
     input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "OUT" }} }} ] }}"#
        )
    };
    let dir = tempfile::tempdir().unwrap();
    for bad in ["-5", "\"invalid_value\"", "12345678901"] {
        let parsed = config::parse_pbtxt("e", &text(bad));
        assert!(parsed.is_err(), "{bad} must not parse as a uint32");
    }
    let mut cfg = config::parse_pbtxt("e", &text("2000000")).unwrap();
    config::normalize(&mut cfg, "e", dir.path());
    let e = config::validate(cfg, "e", dir.path()).unwrap_err();
    assert!(
        e.to_string()
            .contains("max_inflight_requests must be an integer in 0..=1048576"),
        "{e}"
    );
    let mut cfg = config::parse_pbtxt("e", &text("0")).unwrap();
    config::normalize(&mut cfg, "e", dir.path());
    assert!(
        config::validate(cfg, "e", dir.path()).is_ok(),
        "0 is no limit"
    );
}
