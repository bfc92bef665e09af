//! Ensembles (`platform: "ensemble"`) end to end with real plugins and an ONNX model:
//! image → image-preprocess (wasm) → colors (ONNX) → classify-postprocess (wasm), checked
//! against its BLS twin (one wasm plugin calling the model through wasi-nn); load-time
//! validation; a composing model going away.

use std::path::Path;

use serde_json::{json, Value};
use wisp_server::settings::{ControlMode, OnnxEngine};
use wisp_tests::{add_plugin_model, copy_dir, workspace_root, Client, Reply};

use crate::common::start_with;

use wisp_tests::config_param as param;

const PRE: [(&str, &str); 4] = [("width", "4"), ("height", "4"), ("mean", "0"), ("std", "1")];

fn pre_params() -> String {
    PRE.iter().map(|(k, v)| param(k, v)).collect()
}

fn pipeline_config(colors_input: &str, scores_dims: &str) -> String {
    format!(
        r#"platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] }} ]
ensemble_scheduling {{
  step [
    {{ model_name: "preprocess" model_version: -1
       input_map {{ key: "IMAGE" value: "IMAGE" }} output_map {{ key: "PIXELS" value: "pixels" }} }},
    {{ model_name: "colors" model_version: -1
       input_map {{ key: "{colors_input}" value: "pixels" }} output_map {{ key: "probs" value: "probs" }} }},
    {{ model_name: "postprocess_{scores_dims}" model_version: -1
       input_map {{ key: "SCORES" value: "probs" }} output_map {{ key: "CLASSES" value: "CLASSES" }} }}
  ]
}}
"#
    )
}

/// The colour-classification pipeline three ways: steps, ensemble, BLS twin.
fn vision_repo(repo: &Path) {
    copy_dir(
        &workspace_root().join("tests/fixtures/vision/colors"),
        &repo.join("colors"),
    )
    .unwrap();
    add_plugin_model(
        repo,
        "preprocess",
        1,
        "image-preprocess",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] }} ]
dynamic_batching {{ }}
{}"#,
            pre_params()
        ),
    );
    for classes in [3, 5] {
        add_plugin_model(
            repo,
            &format!("postprocess_{classes}"),
            1,
            "classify-postprocess",
            &format!(
                r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ {classes} ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] }} ]
{}"#,
                param("labels", "red,green,blue")
            ),
        );
    }
    add_plugin_model(
        repo,
        "bls",
        1,
        "classify-image",
        &format!(
            r#"backend: "wasm"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "CLASSES" data_type: TYPE_STRING dims: [ 1 ] }} ]
{}{}{}"#,
            pre_params(),
            param("model", "colors"),
            param("labels", "red,green,blue")
        ),
    );
    let ensemble = |name: &str, config: String| {
        std::fs::create_dir_all(repo.join(name).join("1")).unwrap();
        std::fs::write(repo.join(name).join("config.pbtxt"), config).unwrap();
    };
    ensemble("pipeline", pipeline_config("x", "3"));
    // Broken twins: a step input the model does not have, and a dims mismatch.
    ensemble("bad_input", pipeline_config("pixels_in", "3"));
    ensemble("bad_dims", pipeline_config("x", "5"));
}

async fn classify(c: &mut Client, model: &str, rgb: [u8; 3]) -> Reply {
    let png = plugin_imaging::encode_png(5, 3, |_, _| rgb);
    wisp_tests::infer_one_bytes(c, model, "IMAGE", &png)
        .await
        .unwrap()
}

fn class_of(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["outputs"][0]["data"][0]
        .as_str()
        .unwrap()
        .to_string()
}

fn index_row(idx: &Value, name: &str) -> Value {
    idx.as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in {idx}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_pipeline_matches_its_bls_twin_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    vision_repo(dir.path());
    let server = start_with(dir.path(), OnnxEngine::Tract, |s| {
        s.no_wasm_cache = true;
        s.model_control_mode = ControlMode::Explicit;
        s.allow_unauthenticated_control = true;
        s.load_model = vec!["*".into()];
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();

    for (rgb, label) in [
        ([0, 0, 255], "blue"),
        ([0, 220, 10], "green"),
        ([240, 5, 5], "red"),
    ] {
        let ens = class_of(&classify(&mut c, "pipeline", rgb).await);
        let bls = class_of(&classify(&mut c, "bls", rgb).await);
        assert!(ens.ends_with(&format!(":{label}")), "{rgb:?}: {ens}");
        assert_eq!(ens, bls, "ensemble and BLS twin disagree on {rgb:?}");
    }

    // Every step went through its own model's scheduler and statistics.
    for model in ["pipeline", "preprocess", "postprocess_3"] {
        let stats = c
            .get(&format!("/v2/models/{model}/stats"))
            .await
            .unwrap()
            .json();
        assert_eq!(
            stats["model_stats"][0]["inference_count"], 3,
            "{model}: {stats}"
        );
    }
    let stats = c.get("/v2/models/colors/stats").await.unwrap().json();
    assert_eq!(
        stats["model_stats"][0]["inference_count"], 6,
        "ensemble + BLS: {stats}"
    );

    // A step's error fails the request, naming the step, with the step's status.
    let bad = wisp_tests::infer_one_bytes(&mut c, "pipeline", "IMAGE", b"junk")
        .await
        .unwrap();
    assert_eq!(bad.status, 400, "{}", String::from_utf8_lossy(&bad.body));
    let msg = bad.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("ensemble 'pipeline' step 0 ('preprocess')"),
        "{msg}"
    );

    // Load-time validation names the step and the problem.
    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    let row = index_row(&idx, "bad_input");
    assert_eq!(row["state"], "UNAVAILABLE");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("step 1 ('colors'): the model has no input 'pixels_in'"),
        "{reason}"
    );
    let row = index_row(&idx, "bad_dims");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("step 2 ('postprocess_5'): input 'SCORES' has dims [5]"),
        "{reason}"
    );

    // A composing model going away makes the ensemble's requests fail clearly.
    let r = c
        .send("POST", "/v2/repository/models/colors/unload", &[], "{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = classify(&mut c, "pipeline", [0, 0, 255]).await;
    let msg = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(r.status >= 400, "{msg}");
    assert!(msg.contains("step 1 ('colors')"), "{msg}");
    // ... and the ensemble reports not-ready until the model is back.
    assert_eq!(
        c.get("/v2/models/pipeline/ready").await.unwrap().status,
        400
    );
    let r = c
        .send("POST", "/v2/repository/models/colors/load", &[], "{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        c.get("/v2/models/pipeline/ready").await.unwrap().status,
        200
    );
    let back = class_of(&classify(&mut c, "pipeline", [0, 0, 255]).await);
    assert!(back.ends_with(":blue"), "{back}");
    server.shutdown().await.unwrap();
}

/// The README's demo pipeline on the real PP-OCR direction classifier: an upright and a
/// rotated text line through the `text_direction` ensemble and its BLS twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_direction_demo_reads_upright_and_rotated_text() {
    let repo = workspace_root().join("model_repo");
    for f in [
        "ppocr_cls/1/model.onnx",
        "ppocr_preprocess/1/model.wasm",
        "ppocr_postprocess/1/model.wasm",
        "text_direction_bls/1/model.wasm",
    ] {
        assert!(
            repo.join(f).is_file(),
            "model_repo/{f} is missing: run `./dev test` (it fetches the model and installs the plugins)"
        );
    }
    // every request traced, the file written at shutdown
    let traces = tempfile::tempdir().unwrap();
    let trace_file = traces.path().join("trace.json");
    let trace_config = vec![
        format!("triton,file={}", trace_file.display()),
        "level=TIMESTAMPS".to_string(),
        "rate=1".to_string(),
    ];
    let server = start_with(&repo, OnnxEngine::Tract, |s| {
        s.no_wasm_cache = true;
        s.trace_config = trace_config;
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for model in ["text_direction", "text_direction_bls"] {
        let ready = c.get(&format!("/v2/models/{model}/ready")).await.unwrap();
        assert_eq!(ready.status, 200, "{model}");
    }
    let images = workspace_root().join("tests/fixtures/images");
    for (file, want) in [("text_upright.png", "0"), ("text_rotated.png", "180")] {
        let png = std::fs::read(images.join(file)).unwrap();
        let mut answers = Vec::new();
        for model in ["text_direction", "text_direction_bls"] {
            let r = wisp_tests::infer_one_bytes(&mut c, model, "IMAGE", &png)
                .await
                .unwrap();
            let answer = class_of(&r);
            let (score, label) = answer.split_once(':').unwrap();
            let label = label.rsplit(':').next().unwrap();
            assert_eq!(label, want, "{model} on {file}: {answer}");
            assert!(
                score.parse::<f32>().unwrap() > 0.5,
                "{model} on {file}: {answer}"
            );
            answers.push(answer);
        }
        assert_eq!(
            answers[0], answers[1],
            "ensemble and BLS twin disagree on {file}"
        );
    }
    server.shutdown().await.unwrap();
    // The BLS plugin's wasi-nn call is a child trace of its request, with its own queue and
    // compute timestamps, as an ensemble's steps are.
    let objects: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&trace_file).unwrap()).unwrap();
    let heads: Vec<_> = objects
        .iter()
        .filter(|o| o.get("model_name").is_some())
        .collect();
    let stamps = |id: &serde_json::Value| -> Vec<String> {
        objects
            .iter()
            .filter(|o| o.get("timestamps").is_some() && &o["id"] == id)
            .flat_map(|o| o["timestamps"].as_array().unwrap().iter())
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    let bls: Vec<_> = heads
        .iter()
        .filter(|h| h["model_name"] == "text_direction_bls")
        .collect();
    assert_eq!(bls.len(), 2, "{heads:?}");
    for b in bls {
        let calls: Vec<_> = heads
            .iter()
            .filter(|h| h.get("parent_id") == Some(&b["id"]))
            .collect();
        assert_eq!(calls.len(), 1, "one wasi-nn call: {heads:?}");
        assert_eq!(calls[0]["model_name"], "ppocr_cls");
        assert_eq!(calls[0]["model_version"], 1);
        let names = stamps(&calls[0]["id"]);
        for want in [
            "REQUEST_START",
            "QUEUE_START",
            "COMPUTE_START",
            "COMPUTE_END",
            "REQUEST_END",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
    }
    let ensemble_steps = heads
        .iter()
        .filter(|h| h["model_name"] == "text_direction")
        .map(|e| {
            heads
                .iter()
                .filter(|h| h.get("parent_id") == Some(&e["id"]))
                .count()
        })
        .collect::<Vec<_>>();
    assert_eq!(
        ensemble_steps,
        vec![3, 3],
        "each ensemble request traces its three steps"
    );
}

/// Sample files of known types, written for the content-type test.
fn sample_files(dir: &Path) -> Vec<(String, &'static str)> {
    let files: Vec<(&str, Vec<u8>, &'static str)> = vec![
        (
            "main.py",
            b"import os\nimport sys\n\n\ndef main():\n    for name in sorted(os.listdir(\".\")):\n        print(name, os.path.getsize(name))\n\n\nif __name__ == \"__main__\":\n    main()\n".to_vec(),
            "python",
        ),
        (
            "models.json",
            b"{\n  \"name\": \"wisp\",\n  \"version\": 1,\n  \"models\": [{\"id\": \"ppocr_cls\", \"ready\": true}, {\"id\": \"magika\", \"ready\": false}]\n}\n".to_vec(),
            "json",
        ),
        (
            "index.html",
            b"<!DOCTYPE html>\n<html>\n<head><title>Wisp</title></head>\n<body>\n<h1>Hello</h1>\n<p>An inference server.</p>\n</body>\n</html>\n".to_vec(),
            "html",
        ),
        (
            "args.c",
            b"#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n        printf(\"%s\\n\", argv[i]);\n    }\n    return 0;\n}\n".to_vec(),
            "c",
        ),
        (
            "count.sh",
            b"#!/bin/sh\nset -e\nfor f in *.txt; do\n  echo \"$f\"\n  wc -l \"$f\"\ndone\n".to_vec(),
            "shell",
        ),
        (
            "line.png",
            std::fs::read(workspace_root().join("tests/fixtures/images/text_upright.png")).unwrap(),
            "png",
        ),
        (
            "photo.jpg",
            plugin_imaging::encode_jpeg(64, 48, 85, |x, y| [(x * 4) as u8, (y * 5) as u8, 128]),
            "jpeg",
        ),
        ("empty.bin", Vec::new(), "empty"),
        ("tiny.txt", b"hi".to_vec(), "txt"),
    ];
    files
        .into_iter()
        .map(|(name, data, want)| {
            std::fs::write(dir.join(name), data).unwrap();
            (name.to_string(), want)
        })
        .collect()
}

/// The README's content-type pipeline on Google's Magika model gives the same labels as the
/// reference `magika` Python package on the same files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_type_demo_matches_the_magika_package() {
    let repo = workspace_root().join("model_repo");
    for f in [
        "magika/1/model.onnx",
        "magika_labels/data/config.min.json",
        "magika_features/1/model.wasm",
        "magika_labels/1/model.wasm",
    ] {
        assert!(
            repo.join(f).is_file(),
            "model_repo/{f} is missing: run `./dev test` (it fetches the model and installs the plugins)"
        );
    }
    let python = std::env::var("WISP_PYTHON")
        .expect("WISP_PYTHON is not set: run the tests with `./dev test` (it installs magika)");
    let samples = tempfile::tempdir().unwrap();
    let files = sample_files(samples.path());
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(
            "import json, sys\nfrom magika import Magika\nm = Magika()\n\
             print(json.dumps({p: str(m.identify_path(p).output.label) for p in sys.argv[1:]}))",
        )
        .args(files.iter().map(|(n, _)| samples.path().join(n)))
        .output()
        .expect("run the magika reference");
    assert!(
        out.status.success(),
        "magika reference failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference: Value = serde_json::from_slice(&out.stdout).unwrap();

    let server = start_with(&repo, OnnxEngine::Tract, |s| s.no_wasm_cache = true).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for (name, known) in &files {
        let bytes = std::fs::read(samples.path().join(name)).unwrap();
        let r = wisp_tests::infer_one_bytes(&mut c, "content_type", "CONTENT", &bytes)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let j = r.json();
        let label = j["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == "LABEL")
            .unwrap()["data"][0]
            .as_str()
            .unwrap()
            .to_string();
        let want = reference[samples.path().join(name).to_str().unwrap()]
            .as_str()
            .unwrap();
        assert_eq!(label, want, "{name}: wisp vs the magika package");
        assert_eq!(label, *known, "{name}");
    }
    file_route_runs_only_the_branch_its_router_picks(&mut c, samples.path(), &files).await;
    server.shutdown().await.unwrap();
}

/// The `file_route` ensemble on the same files (and server): a text or code file gets an
/// embedding and no direction, a PNG or JPEG a direction and no embedding, a file no route
/// lists only its label (the router sets no output at all); the branch not taken is counted as
/// skipped, and naming its output is a 400 that says which step skipped it.
async fn file_route_runs_only_the_branch_its_router_picks(
    c: &mut Client,
    dir: &Path,
    files: &[(String, &'static str)],
) {
    let skips = |stats: &Value| -> Vec<u64> {
        stats["model_stats"][0]["skipped_steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["count"].as_u64().unwrap())
            .collect()
    };
    let before = skips(&c.get("/v2/models/file_route/stats").await.unwrap().json());
    let (mut texts, mut images, mut neither) = (0, 0, 0);
    for (name, label) in files {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let r = wisp_tests::infer_one_bytes(c, "file_route", "CONTENT", &bytes)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let j = r.json();
        let outputs: Vec<&str> = j["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        let want: &[&str] = match *label {
            "png" | "jpeg" => {
                images += 1;
                &["LABEL", "DIRECTION"]
            }
            "empty" => {
                neither += 1;
                &["LABEL"]
            }
            _ => {
                texts += 1;
                &["LABEL", "EMBEDDING"]
            }
        };
        assert_eq!(outputs, want, "{name} ({label})");
    }
    assert!(texts > 0 && images > 0 && neither > 0);
    let after = skips(&c.get("/v2/models/file_route/stats").await.unwrap().json());
    let skipped: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    // content_type and the router always run; each branch is skipped when the other is taken
    assert_eq!(skipped, [0, 0, images + neither, texts + neither]);
    // naming the output of the branch not taken says which step skipped it, and why
    let text = wisp_tests::bytes_element(&std::fs::read(dir.join("main.py")).unwrap());
    let header = serde_json::to_vec(&json!({
        "inputs": [{"name": "CONTENT", "datatype": "BYTES", "shape": [1, 1],
                    "parameters": {"binary_data_size": text.len()}}],
        "outputs": [{"name": "DIRECTION"}],
    }))
    .unwrap();
    let n = header.len();
    let named = [header, text].concat();
    let r = c
        .send(
            "POST",
            "/v2/models/file_route/infer",
            &[("inference-header-content-length", n.to_string())],
            named,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["error"],
        "ensemble 'file_route': output 'DIRECTION' was not produced: step 3 ('text_direction') \
         did not run: its input 'IMAGE' was not produced (step 1 ('route_by_type') did not \
         produce its output 'IMAGE')"
    );
}
