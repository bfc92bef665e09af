//! Lifecycle tests over a fake backend: no sockets, no ONNX Runtime, no wasm.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wisp_core::backend::{Backend, ExecTiming, Instance, LoadedModel};
use wisp_core::config::{ModelConfig, ModelIo};
use wisp_core::tensor::{decode_bytes_elements, encode_bytes_elements};
use wisp_core::{DataType, Error, InferRequest, InferResponse, Result, Tensor};

use super::*;

/// Serves the text of its model file as the BYTES output `TAG`; a file starting with "broken"
/// fails to load. Records every load, in order.
#[derive(Default)]
struct FakeBackend {
    loads: Mutex<Vec<String>>,
}

impl FakeBackend {
    fn loads(&self) -> Vec<String> {
        self.loads.lock().unwrap().clone()
    }
}

struct FakeLoaded(String);

struct FakeInstance(String);

impl Backend for FakeBackend {
    fn describe(&self, _: &Path) -> Result<ModelIo> {
        Err(Error::invalid("the fake backend does not auto-complete"))
    }

    fn load(&self, config: &ModelConfig, model_file: &Path) -> Result<Box<dyn LoadedModel>> {
        self.loads.lock().unwrap().push(config.name.clone());
        let tag = if config.is_ensemble() {
            format!("ensemble {}", config.name)
        } else {
            std::fs::read_to_string(model_file).map_err(|e| Error::invalid(e.to_string()))?
        };
        if tag.starts_with("broken") {
            return Err(Error::invalid("the model file is broken"));
        }
        Ok(Box::new(FakeLoaded(tag)))
    }
}

impl LoadedModel for FakeLoaded {
    fn engine(&self) -> &str {
        "fake"
    }

    fn new_instance(&self, _: usize) -> Result<Box<dyn Instance>> {
        Ok(Box::new(FakeInstance(self.0.clone())))
    }
}

impl Instance for FakeInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        batch
            .iter()
            .map(|_| {
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
    let backend = Arc::new(FakeBackend::default());
    let opts = LoadOptions {
        autocomplete: false,
        threads: 2,
        observers: None,
        host_policies: Default::default(),
        verification: None,
    };
    (
        Registry::new(vec![root.to_path_buf()], backend.clone(), opts),
        backend,
    )
}

/// The tag the served version of `name` answers with.
fn served_tag(r: &Registry, name: &str) -> String {
    let m = r.get(name, None).unwrap();
    let input = Tensor::new("IN", DataType::Fp32, vec![1], vec![0u8; 4].into()).unwrap();
    let request = InferRequest {
        inputs: vec![input],
        ..Default::default()
    };
    let out = m
        .infer_blocking(request, Instant::now() + Duration::from_secs(10))
        .unwrap();
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
    write_model(repo.path(), "a_outer", &ensemble_config("b_inner"), None);
    write_model(repo.path(), "b_inner", &ensemble_config("c_model"), None);
    write_model(repo.path(), "c_model", &plain_config(1), Some("c"));
    let (r, backend) = registry(repo.path());
    r.load_initial(None).unwrap();
    assert_eq!(backend.loads(), ["c_model", "b_inner", "a_outer"]);
    assert!(r.all_ready());
}

#[test]
fn loading_an_ensemble_loads_what_it_composes() {
    let repo = tempfile::tempdir().unwrap();
    write_model(repo.path(), "a_outer", &ensemble_config("b_inner"), None);
    write_model(repo.path(), "b_inner", &ensemble_config("c_model"), None);
    write_model(repo.path(), "c_model", &plain_config(1), Some("c"));
    let (r, backend) = registry(repo.path());
    // explicit mode, only the outer ensemble named
    r.load_initial(Some(&["a_outer".to_string()])).unwrap();
    assert_eq!(backend.loads(), ["c_model", "b_inner", "a_outer"]);
    r.check_ready("a_outer", None).unwrap();
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
    write_model(repo.path(), "a_outer", &ensemble_config("b_inner"), None);
    write_model(repo.path(), "b_inner", &ensemble_config("c_model"), None);
    write_model(repo.path(), "c_model", &plain_config(1), Some("c"));
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
