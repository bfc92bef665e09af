//! A real compiled plugin (`batch-bls`) whose model calls reach a fake [`ModelCaller`]: what
//! the plugin host sends, and how it answers the guest, with no registry, scheduler or engine.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wisp_core::backend::{Backend, ExecTiming, ModelCaller};
use wisp_core::repository::ModelDir;
use wisp_core::{Error, InferRequest, InferResponse, Result, Tensor};
use wisp_plugin_runtime::{WasmBackend, WasmOptions};
use wisp_tests::{add_plugin_model, config_param, plugin_wasm};

/// A call the fake received: the model, INPUT0's shape, the request's call path.
type Call = (String, Vec<i64>, Vec<String>);

/// `add_sub` computed here: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 − INPUT1; any other
/// model is not served (as the registry answers). With `fail`, every call is refused.
struct FakeModels {
    fail: Option<Error>,
    calls: Mutex<Vec<Call>>,
}

impl FakeModels {
    fn new(fail: Option<Error>) -> Arc<Self> {
        Arc::new(FakeModels {
            fail,
            calls: Mutex::new(Vec::new()),
        })
    }

    fn answer(&self, model: &str, r: &InferRequest) -> Result<InferResponse> {
        let input = |name: &str| {
            r.inputs
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::invalid(format!("no input '{name}'")))
        };
        let a = input("INPUT0")?;
        let b: Vec<f32> = input("INPUT1")?.values()?;
        self.calls.lock().unwrap().push((
            model.to_string(),
            a.shape.clone(),
            r.call_path.iter().map(|m| m.to_string()).collect(),
        ));
        let a: Vec<f32> = a.values()?;
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let diff: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        let shape = input("INPUT0")?.shape.clone();
        Ok(InferResponse::new(vec![
            Tensor::from_values("OUTPUT0", shape.clone(), &sum)?,
            Tensor::from_values("OUTPUT1", shape, &diff)?,
        ]))
    }
}

impl ModelCaller for FakeModels {
    fn check(&self, model: &str, _: Option<&str>) -> Result<()> {
        match model {
            "add_sub" => Ok(()),
            _ => Err(Error::not_found(format!(
                "Request for unknown model: '{model}' is not found"
            ))),
        }
    }

    fn infer(
        &self,
        model: &str,
        _: Option<&str>,
        r: InferRequest,
        _: Instant,
    ) -> Result<InferResponse> {
        self.answer(model, &r)
    }

    fn infer_batch(
        &self,
        model: &str,
        _: Option<&str>,
        requests: Vec<InferRequest>,
        _: Instant,
    ) -> Result<Vec<Result<InferResponse>>> {
        self.check(model, None)?;
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        Ok(requests.iter().map(|r| self.answer(model, r)).collect())
    }
}

const CONFIG: &str = r#"backend: "wasm"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"#;

/// `batch-bls` calling `target`, loaded on a wasm backend whose models are `fake`'s.
fn load(
    repo: &Path,
    target: &str,
    fake: Arc<FakeModels>,
) -> Result<Box<dyn wisp_core::backend::Instance>> {
    let config = format!("{CONFIG}{}", config_param("model", target));
    add_plugin_model(repo, "bls", 1, "batch-bls", &config);
    let backend = WasmBackend::new(WasmOptions::default(), Some(fake as Arc<dyn ModelCaller>));
    let dir = ModelDir {
        name: "bls".into(),
        path: repo.join("bls"),
    };
    let spec = wisp_server::models::prepare_config(&dir, &backend, false)?;
    backend
        .load(&spec, &repo.join("bls/1/model.wasm"))?
        .new_instance(0)
}

fn request(rows: usize, a: f32) -> InferRequest {
    let n = rows * 16;
    InferRequest {
        inputs: vec![
            Tensor::from_values("INPUT0", vec![rows as i64, 16], &vec![a; n]).unwrap(),
            Tensor::from_values("INPUT1", vec![rows as i64, 16], &vec![1.0f32; n]).unwrap(),
        ],
        ..Default::default()
    }
}

#[test]
fn a_plugin_batch_reaches_the_caller_as_one_request_and_splits_back() {
    // plugin_wasm panics with the build command when the example plugins are not built
    let _ = plugin_wasm("batch-bls");
    let repo = tempfile::tempdir().unwrap();
    let fake = FakeModels::new(None);
    let mut instance = load(repo.path(), "add_sub", fake.clone()).unwrap();
    let batch = [request(1, 10.0), request(2, 20.0), request(1, 30.0)];
    let out = instance.execute(&batch, &mut ExecTiming::default());
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "one call for the whole batch: {calls:?}");
    let (model, shape, path) = &calls[0];
    assert_eq!(model, "add_sub");
    assert_eq!(shape, &vec![4, 16], "the batch's rows, concatenated");
    assert_eq!(
        path,
        &vec!["bls".to_string()],
        "the plugin is on its call's path"
    );
    for (r, (rows, a)) in out.iter().zip([(1, 10.0f32), (2, 20.0), (1, 30.0)]) {
        let r = r.as_ref().unwrap();
        let sum = r.outputs.iter().find(|t| t.name == "OUTPUT0").unwrap();
        assert_eq!(
            sum.shape,
            vec![rows, 16],
            "each request gets its own rows back"
        );
        assert_eq!(
            sum.values::<f32>().unwrap(),
            vec![a + 1.0; rows as usize * 16]
        );
    }
}

#[test]
fn a_refused_call_reaches_every_request_of_the_batch_with_the_callers_words() {
    let _ = plugin_wasm("batch-bls");
    let repo = tempfile::tempdir().unwrap();
    let fake = FakeModels::new(Some(Error::unavailable("model 'add_sub' is unloading")));
    let mut instance = load(repo.path(), "add_sub", fake).unwrap();
    let out = instance.execute(
        &[request(1, 1.0), request(1, 2.0)],
        &mut ExecTiming::default(),
    );
    for r in out {
        let e = r.unwrap_err();
        assert!(e.message().contains("model 'add_sub' is unloading"), "{e}");
    }
}

#[test]
fn a_call_to_a_model_the_caller_does_not_serve_fails_with_the_callers_reason() {
    let _ = plugin_wasm("batch-bls");
    let repo = tempfile::tempdir().unwrap();
    let fake = FakeModels::new(None);
    let mut instance = load(repo.path(), "nope", fake.clone()).unwrap();
    let out = instance.execute(&[request(1, 1.0)], &mut ExecTiming::default());
    let e = out[0].as_ref().unwrap_err();
    assert!(e.message().contains("'nope' is not found"), "{e}");
    assert!(fake.calls.lock().unwrap().is_empty(), "nothing ran");
}
