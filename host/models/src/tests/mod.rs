//! Lifecycle tests over a fake backend: no sockets, no ONNX Runtime, no wasm.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wisp_core::backend::{Backend, ExecTiming, Instance, LoadedModel};
use wisp_core::config::{ModelIo, ModelSpec, Signature};
use wisp_core::tensor::{decode_bytes_elements, encode_bytes_elements};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

use super::*;

/// Serves the text of its model file as the BYTES output `TAG`; a file starting with "broken"
/// fails to load. Records every load, in order, and the signature each was given.
#[derive(Default)]
struct FakeBackend {
    loads: Mutex<Vec<String>>,
    signatures: Mutex<Vec<Arc<Signature>>>,
}

impl FakeBackend {
    fn loads(&self) -> Vec<String> {
        self.loads.lock().unwrap().clone()
    }

    fn last_signature(&self) -> Arc<Signature> {
        self.signatures.lock().unwrap().last().unwrap().clone()
    }
}

struct FakeLoaded(String);

struct FakeInstance(String);

impl Backend for FakeBackend {
    fn describe(&self, _: &Path) -> Result<ModelIo> {
        Err(Error::invalid("the fake backend does not auto-complete"))
    }

    fn load(&self, spec: &ModelSpec, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        let config = &*spec.config;
        self.loads.lock().unwrap().push(config.name.clone());
        self.signatures.lock().unwrap().push(spec.signature.clone());
        let tag = if config.is_ensemble() {
            format!("ensemble {}", config.name)
        } else {
            std::fs::read_to_string(model_file).map_err(|e| Error::invalid(e.to_string()))?
        };
        if tag.starts_with("broken") {
            return Err(Error::invalid("the model file is broken"));
        }
        if tag.starts_with("panic") {
            panic!("the fake compiler hit an internal error");
        }
        Ok(Box::new(FakeLoaded(tag)))
    }
}

impl LoadedModel for FakeLoaded {
    fn engine(&self) -> &str {
        "fake"
    }

    fn new_instance(&self, index: usize) -> Result<Box<dyn Instance>> {
        if self.0.starts_with("two at most") && index >= 2 {
            return Err(Error::invalid("no room for a third instance"));
        }
        Ok(Box::new(FakeInstance(self.0.clone())))
    }
}

impl Instance for FakeInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        if self.0.starts_with("slow") {
            std::thread::sleep(Duration::from_millis(15));
        }
        batch
            .iter()
            .map(|_| {
                if self.0.starts_with("fail") {
                    return Err(Error::internal("this version fails on purpose"));
                }
                // "[slow ]scores 0.1 0.9 ...": those numbers as one FP32 row, `SCORES`.
                if let Some(list) = self.0.trim_start_matches("slow ").strip_prefix("scores") {
                    let v: Vec<f32> = list
                        .split_whitespace()
                        .map(|x| x.parse().unwrap())
                        .collect();
                    let shape = vec![1, v.len() as i64];
                    return Ok(InferResponse::new(vec![Tensor::from_values(
                        "SCORES", shape, &v,
                    )?]));
                }
                let data = encode_bytes_elements([self.0.as_bytes()]);
                Ok(InferResponse::new(vec![Tensor::new(
                    "TAG",
                    DataType::Bytes,
                    vec![1],
                    data.into(),
                )?]))
            })
            .collect()
    }
}

fn plain_config(count: usize) -> String {
    format!(
        r#"platform: "onnxruntime_onnx"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "TAG" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
# {}
"#,
        "-".repeat(count)
    )
}

fn ensemble_config(step: &str) -> String {
    format!(
        r#"platform: "ensemble"
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "TAG" data_type: TYPE_STRING dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "IN" value: "IN" }}
  output_map {{ key: "TAG" value: "TAG" }}
}} ] }}
"#
    )
}

/// Writes an ensemble `a_outer` of an ensemble `b_inner` of a plain model `c_model` under
/// `root` (names that sort outer first).
fn write_nested(root: &Path) {
    write_model(root, "a_outer", &ensemble_config("b_inner"), None);
    write_model(root, "b_inner", &ensemble_config("c_model"), None);
    write_model(root, "c_model", &plain_config(1), Some("c"));
}

/// Writes model `name` (config and version 1) under `root`; `file` is the model file's text,
/// `None` for an ensemble.
fn write_model(root: &Path, name: &str, config: &str, file: Option<&str>) {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("1")).unwrap();
    std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    if let Some(text) = file {
        std::fs::write(dir.join("1/model.onnx"), text).unwrap();
    }
}

fn registry(root: &Path) -> (Registry, Arc<FakeBackend>) {
    registry_with_state(root, None)
}

fn registry_with_state(root: &Path, state_dir: Option<&Path>) -> (Registry, Arc<FakeBackend>) {
    let backend = Arc::new(FakeBackend::default());
    let opts = LoadOptions {
        autocomplete: false,
        threads: 2,
        observers: None,
        host_policies: Default::default(),
        verification: None,
        state_dir: state_dir.map(Path::to_path_buf),
        rate_limiter: None,
    };
    (
        Registry::new(vec![root.to_path_buf()], backend.clone(), opts),
        backend,
    )
}

/// The version of `name` that serves, and its answer to a request of one zero.
fn ask(r: &Registry, name: &str) -> (Arc<ModelVersion>, InferResponse) {
    let m = r.get(name, None).unwrap();
    let input = Tensor::new("IN", DataType::Fp32, vec![1], vec![0u8; 4].into()).unwrap();
    let request = InferRequest {
        inputs: vec![input],
        ..Default::default()
    };
    let out = m
        .infer_blocking(request, Instant::now() + Duration::from_secs(10))
        .unwrap();
    (m, out)
}

/// The tag the served version of `name` answers with.
fn served_tag(r: &Registry, name: &str) -> String {
    let (_, out) = ask(r, name);
    let tags = decode_bytes_elements(&out.outputs[0].data).unwrap();
    String::from_utf8(tags[0].to_vec()).unwrap()
}

/// Rewrites a file so that poll sees it changed (its size changes; mtimes can be coarse).
fn rewrite(path: &Path, text: &str) {
    assert_ne!(std::fs::metadata(path).unwrap().len(), text.len() as u64);
    std::fs::write(path, text).unwrap();
}

fn index_row(r: &Registry, name: &str) -> IndexEntry {
    r.index(false)
        .unwrap()
        .into_iter()
        .find(|e| e.name == name)
        .unwrap()
}

#[test]
fn poll_reloads_a_changed_model() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("one"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(served_tag(&r, "m"), "one");

    r.poll();
    assert_eq!(
        backend.loads().len(),
        1,
        "an unchanged model is not reloaded"
    );

    rewrite(&repo.path().join("m/1/model.onnx"), "second");
    r.poll();
    assert_eq!(backend.loads().len(), 2);
    assert_eq!(served_tag(&r, "m"), "second");
}

#[test]
fn a_failed_reload_keeps_the_old_version_serving() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("one"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();

    let file = repo.path().join("m/1/model.onnx");
    rewrite(&file, "broken file");
    let err = r.load("m", None).unwrap_err();
    assert!(err.message().starts_with("failed to load 'm'"), "{err}");
    assert_eq!(served_tag(&r, "m"), "one");
    let row = index_row(&r, "m");
    assert_eq!(row.state, "READY");
    assert!(
        row.reason
            .starts_with("reload failed, previous version still serving"),
        "{row:?}"
    );

    rewrite(&file, "fixed");
    r.poll();
    assert_eq!(served_tag(&r, "m"), "fixed");
    assert_eq!(
        index_row(&r, "m").reason,
        "",
        "the old failure is forgotten"
    );
}

#[test]
fn a_model_that_never_loaded_is_unavailable_with_its_reason() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("broken"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    let row = index_row(&r, "m");
    assert_eq!((row.state, row.version), ("UNAVAILABLE", Some(1)));
    assert!(row.reason.contains("broken"), "{row:?}");
    assert_eq!(
        r.get("m", None).err().unwrap().kind(),
        wisp_core::ErrorKind::Unavailable
    );
    assert!(!r.all_ready());
}

#[test]
fn a_count_change_resizes_in_place() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("one"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();
    let before = r.get("m", None).unwrap();
    assert_eq!(before.scheduler.instance_count(), 1);

    rewrite(&repo.path().join("m/config.pbtxt"), &plain_config(3));
    r.poll();
    let after = r.get("m", None).unwrap();
    assert_eq!(backend.loads().len(), 1, "a resize does not reload");
    assert_eq!(after.scheduler.instance_count(), 3);
    assert!(
        Arc::ptr_eq(before.stats(), after.stats()),
        "same statistics"
    );
    assert_eq!(after.config.instance_count(), 3);

    rewrite(&repo.path().join("m/config.pbtxt"), &plain_config(2));
    r.poll();
    assert_eq!(r.get("m", None).unwrap().config.instance_count(), 2);
    assert_eq!(backend.loads().len(), 1);
    assert_eq!(served_tag(&r, "m"), "one");
}

#[test]
fn a_failed_resize_keeps_the_instances_serving_and_is_counted() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("two at most"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();

    rewrite(&repo.path().join("m/config.pbtxt"), &plain_config(3));
    let err = r.load("m", None).unwrap_err();
    assert!(
        err.message().contains("resize failed") && err.message().contains("third instance"),
        "{}",
        err.message()
    );
    assert_eq!(
        backend.loads().len(),
        1,
        "the resize was tried, not a reload"
    );
    let m = r.get("m", None).unwrap();
    assert_eq!(m.scheduler.instance_count(), 1);
    assert_eq!(
        m.config.instance_count(),
        1,
        "the old config still describes it"
    );
    assert_eq!(served_tag(&r, "m"), "two at most");
    assert_eq!(counts(&r, "m").load_failures, 1);
    assert!(index_row(&r, "m").reason.contains("resize failed"));

    // A resize that fits clears the mark.
    rewrite(&repo.path().join("m/config.pbtxt"), &plain_config(2));
    r.load("m", None).unwrap();
    assert_eq!(r.get("m", None).unwrap().scheduler.instance_count(), 2);
    assert_eq!(index_row(&r, "m").reason, "");
}

#[test]
fn poll_loads_new_models_and_unloads_removed_ones() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "a", &plain_config(1), Some("a"));
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();

    write_model(repo.path(), "b", &plain_config(1), Some("b"));
    std::fs::remove_dir_all(repo.path().join("a")).unwrap();
    r.poll();
    assert_eq!(served_tag(&r, "b"), "b");
    assert_eq!(
        r.entry("a").err().unwrap().kind(),
        wisp_core::ErrorKind::NotFound
    );
    let row = index_row(&r, "b");
    assert_eq!(row.state, "READY");
    assert!(r.index(false).unwrap().iter().all(|e| e.name != "a"));
}

#[test]
fn unload_stops_serving_and_a_later_load_starts_afresh() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "m", &plain_config(1), Some("one"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();
    r.unload("m").unwrap();
    assert_eq!(
        r.entry("m").err().unwrap().kind(),
        wisp_core::ErrorKind::NotFound
    );
    assert_eq!(index_row(&r, "m").reason, "unloaded");
    // same files: a full load, not a resize of what is gone
    r.load("m", None).unwrap();
    assert_eq!(backend.loads().len(), 2);
    assert_eq!(served_tag(&r, "m"), "one");
    assert_eq!(
        r.unload("nope").unwrap_err().kind(),
        wisp_core::ErrorKind::NotFound
    );
}

#[test]
fn nested_ensembles_load_after_what_they_compose_whatever_the_order() {
    let repo = tempfile::tempdir().unwrap();
    // names sort so that the outer ensemble comes first and the plain model last
    write_nested(repo.path());
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(backend.loads(), ["c_model", "b_inner", "a_outer"]);
    assert!(r.all_ready());
}

#[test]
fn loading_an_ensemble_loads_what_it_composes() {
    let repo = tempfile::tempdir().unwrap();
    write_nested(repo.path());
    let (r, backend) = registry(repo.path());
    // explicit mode, only the outer ensemble named
    r.load_initial(Some(&["a_outer".to_string()])).unwrap();
    assert_eq!(backend.loads(), ["c_model", "b_inner", "a_outer"]);
    r.check_ready("a_outer", None).unwrap();
}

#[test]
fn unloaded_steps_name_what_loading_an_ensemble_would_load() {
    let repo = tempfile::tempdir().unwrap();
    write_nested(repo.path());
    let (r, _backend) = registry(repo.path());
    assert_eq!(r.unloaded_steps("a_outer", None), ["b_inner"]);
    assert_eq!(r.unloaded_steps("b_inner", None), ["c_model"]);
    assert!(
        r.unloaded_steps("c_model", None).is_empty(),
        "not an ensemble"
    );
    assert!(
        r.unloaded_steps("nope", None).is_empty(),
        "not in the repository"
    );
    // A load request's config replaces the file's.
    let other = wisp_core::config::config_to_json(
        &wisp_core::config::parse_pbtxt("a_outer", &ensemble_config("c_model")).unwrap(),
    )
    .to_string();
    assert_eq!(r.unloaded_steps("a_outer", Some(&other)), ["c_model"]);
    r.load("c_model", None).unwrap();
    assert!(
        r.unloaded_steps("b_inner", None).is_empty(),
        "already loaded"
    );
}

#[test]
fn ensembles_that_compose_each_other_stop_after_a_bounded_depth() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "x", &ensemble_config("y"), None);
    write_model(repo.path(), "y", &ensemble_config("x"), None);
    let (r, backend) = registry(repo.path());
    // the fake backend does not check what an ensemble composes; the real one refuses a step
    // whose model is not loaded. Either way the walk ends.
    let _ = r.load("x", None);
    assert!(
        backend.loads().len() <= MAX_ENSEMBLE_DEPTH + 1,
        "{:?}",
        backend.loads()
    );
}

#[test]
fn unload_dependents_unloads_what_only_the_ensemble_used() {
    let repo = tempfile::tempdir().unwrap();
    write_nested(repo.path());
    write_model(repo.path(), "d_other", &ensemble_config("c_model"), None);
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();

    r.unload_with_dependents("a_outer").unwrap();
    let loaded: Vec<String> = r.models().into_keys().collect();
    // b_inner went with a_outer; c_model stays, d_other still composes it
    assert_eq!(loaded, ["c_model", "d_other"]);

    r.unload_with_dependents("d_other").unwrap();
    assert!(r.models().is_empty());
}

mod fake_steps;
mod gate;
mod sla;

fn counts(r: &Registry, name: &str) -> rollout::LifecycleCounts {
    r.lifecycle_counts()
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, c, _)| c)
        .unwrap_or_default()
}

#[test]
fn a_panic_while_loading_fails_that_model_only() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "good", &plain_config(1), Some("fine"));
    write_model(
        repo.path(),
        "bad",
        &plain_config(1),
        Some("panic in the compiler"),
    );
    let (r, _) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(served_tag(&r, "good"), "fine");
    let row = index_row(&r, "bad");
    assert_eq!(row.state, "UNAVAILABLE");
    assert!(
        row.reason.contains("loading panicked") && row.reason.contains("internal error"),
        "{row:?}"
    );
    // A reload that panics leaves the serving version alone.
    rewrite(&repo.path().join("good/1/model.onnx"), "panic again");
    assert!(r.load("good", None).is_err());
    assert_eq!(served_tag(&r, "good"), "fine");
}

#[test]
fn a_sequence_model_backend_sees_the_control_and_state_tensors_clients_do_not() {
    let repo = tempfile::tempdir().unwrap();
    let config = r#"platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP16 dims: [ 2, 3 ] } ]
}
"#;
    write_model(repo.path(), "s", config, Some("seq"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();

    let names = |t: &[wisp_core::config::TensorSpec]| -> Vec<(String, DataType, Vec<i64>)> {
        t.iter()
            .map(|t| (t.name.clone(), t.datatype, t.dims.clone()))
            .collect()
    };
    let seen = backend.last_signature();
    assert_eq!(seen.max_batch_size, 4);
    assert_eq!(
        names(&seen.inputs),
        [
            ("IN".to_string(), DataType::Fp32, vec![1]),
            ("START".to_string(), DataType::Int32, vec![1]),
            ("CORRID".to_string(), DataType::Uint64, vec![1]),
            ("STATE_IN".to_string(), DataType::Fp16, vec![2, 3]),
        ]
    );
    assert_eq!(
        names(&seen.outputs),
        [
            ("TAG".to_string(), DataType::Bytes, vec![1]),
            ("STATE_OUT".to_string(), DataType::Fp16, vec![2, 3]),
        ]
    );

    // What clients are shown and validated against stays the config as written.
    let served = r.get("s", None).unwrap();
    assert_eq!(
        names(&served.signature.inputs),
        [("IN".to_string(), DataType::Fp32, vec![1])]
    );
    assert_eq!(served.signature.outputs.len(), 1);
    assert_eq!(served.config.input.len(), 1);
}
