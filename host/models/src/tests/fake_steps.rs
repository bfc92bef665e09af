//! The ensemble backend over a fake [`StepCaller`]: the DAG, its type checks and its error
//! paths, with no registry, scheduler or engine behind the steps.

use std::collections::HashMap;
use std::path::Path;
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
        std::thread::spawn(move || {
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
    spec(
        "pipe",
        &format!(
            r#"platform: "ensemble" max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{ step [
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
