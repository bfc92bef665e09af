//! Every fixture model, on both engines, against the outputs ONNX Runtime computed in Python
//! (tests/fixtures/make_fixtures.py → expected.json); and the real pretrained demo model.

use serde_json::{json, Value};
use wisp_server::settings::OnnxEngine;
use wisp_tests::{binary_request, f32_bytes, f32_values, fixture_repo, workspace_root, Client};

use crate::common::{start, ENGINES};

fn max_abs_diff(got: &[Value], want: &[Value]) -> f64 {
    assert_eq!(got.len(), want.len(), "element counts differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| match (g, w) {
            (Value::Number(g), Value::Number(w)) => {
                (g.as_f64().unwrap() - w.as_f64().unwrap()).abs()
            }
            (g, w) => {
                if g == w {
                    0.0
                } else {
                    f64::INFINITY
                }
            }
        })
        .fold(0.0, f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_match_onnxruntime_outputs_on_both_engines() {
    let repo = fixture_repo();
    for engine in ENGINES {
        let server = start(&repo, engine).await;
        let mut c = Client::connect(server.http_addr()).await.unwrap();
        for model in [
            "add_sub",
            "classifier",
            "no_batch",
            "dtypes",
            "add_int64",
            "cast_add_int64",
            "strings",
        ] {
            let expected: Value = serde_json::from_str(
                &std::fs::read_to_string(repo.join(model).join("expected.json")).unwrap(),
            )
            .unwrap();
            let inputs: Vec<Value> = expected["inputs"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(name, t)| json!({"name": name, "datatype": t["datatype"], "shape": t["shape"], "data": t["data"]}))
                .collect();
            let r = c
                .post_json(
                    &format!("/v2/models/{model}/infer"),
                    &json!({"id": model, "inputs": inputs}),
                )
                .await
                .unwrap();
            assert_eq!(
                r.status,
                200,
                "{engine:?} {model}: {}",
                String::from_utf8_lossy(&r.body)
            );
            let body = r.json();
            assert_eq!(body["id"], model);
            assert_eq!(body["model_version"], "1");
            let outputs = body["outputs"].as_array().unwrap();
            for (name, want) in expected["outputs"].as_object().unwrap() {
                let got = outputs
                    .iter()
                    .find(|o| o["name"] == *name)
                    .unwrap_or_else(|| panic!("{model}: output {name} missing"));
                assert_eq!(got["datatype"], want["datatype"], "{model}.{name}");
                assert_eq!(got["shape"], want["shape"], "{model}.{name}");
                let diff = max_abs_diff(
                    got["data"].as_array().unwrap(),
                    want["data"].as_array().unwrap(),
                );
                // FP16 values are exact through Identity; FP32 math may differ in the last bits.
                assert!(
                    diff <= 1e-4,
                    "{engine:?} {model}.{name}: max abs diff {diff}"
                );
            }
        }
        server.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_binary_requests_split_correctly() {
    for engine in ENGINES {
        let server = start(&fixture_repo(), engine).await;
        let mut c = Client::connect(server.http_addr()).await.unwrap();
        // batch of 3 rows in one request, binary in and out
        let a: Vec<f32> = (0..48).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..48).map(|i| (i * 2) as f32).collect();
        let (body, n) = binary_request(
            &[
                ("INPUT0", "FP32", vec![3, 16], f32_bytes(&a)),
                ("INPUT1", "FP32", vec![3, 16], f32_bytes(&b)),
            ],
            true,
        );
        let r = c
            .send(
                "POST",
                "/v2/models/add_sub/infer",
                &[("inference-header-content-length", n.to_string())],
                body,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let hlen: usize = r.headers["inference-header-content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let head: Value = serde_json::from_slice(&r.body[..hlen]).unwrap();
        assert_eq!(head["outputs"][0]["shape"], json!([3, 16]));
        assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 192);
        let sum = f32_values(&r.body[hlen..hlen + 192]);
        let diff = f32_values(&r.body[hlen + 192..]);
        for i in 0..48 {
            assert_eq!(sum[i], a[i] + b[i]);
            assert_eq!(diff[i], a[i] - b[i]);
        }
        server.shutdown().await.unwrap();
    }
}

/// The README's repository: the real PP-OCR direction classifier fetched from its wheel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_repository_serves_the_pretrained_classifier_on_both_engines() {
    let repo = workspace_root().join("model_repo");
    assert!(
        repo.join("ppocr_cls/1/model.onnx").is_file(),
        "model_repo/ppocr_cls/1/model.onnx is missing: run `./dev test` (it fetches it)"
    );
    // A deterministic pseudo-image in [-1, 1].
    let pixels: Vec<f32> = (0..3 * 48 * 192)
        .map(|i| ((i * 7919 % 255) as f32 / 127.5) - 1.0)
        .collect();
    let mut results = Vec::new();
    for engine in ENGINES {
        let server = start(&repo, engine).await;
        let mut c = Client::connect(server.http_addr()).await.unwrap();
        let ready = c.get("/v2/models/ppocr_cls/ready").await.unwrap();
        assert_eq!(ready.status, 200);
        let meta = c.get("/v2/models/ppocr_cls").await.unwrap().json();
        let want_engine = if engine == OnnxEngine::Tract {
            "tract"
        } else {
            "onnxruntime"
        };
        assert_eq!(meta["parameters"]["engine"], want_engine);
        let (body, n) = binary_request(
            &[("x", "FP32", vec![1, 3, 48, 192], f32_bytes(&pixels))],
            true,
        );
        let r = c
            .send(
                "POST",
                "/v2/models/ppocr_cls/infer",
                &[("inference-header-content-length", n.to_string())],
                body,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let hlen: usize = r.headers["inference-header-content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let probs = f32_values(&r.body[hlen..]);
        assert_eq!(probs.len(), 2);
        assert!(
            (probs[0] + probs[1] - 1.0).abs() < 1e-4,
            "softmax output: {probs:?}"
        );
        results.push(probs);
        // classification with the labels file
        let req = json!({
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 48, 192], "data": pixels}],
            "outputs": [{"name": "save_infer_model/scale_0.tmp_1", "parameters": {"classification": 1}}]
        });
        let r = c
            .post_json("/v2/models/ppocr_cls/infer", &req)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let label = r.json()["outputs"][0]["data"][0]
            .as_str()
            .unwrap()
            .to_string();
        assert!(label.ends_with(":0") || label.ends_with(":180"), "{label}");
        server.shutdown().await.unwrap();
    }
    let d = results[0]
        .iter()
        .zip(&results[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d <= 1e-4, "tract vs onnxruntime differ by {d}: {results:?}");
}

/// Triton's ONNX Runtime backend settings, as a Triton repository carries them: every key and
/// the `optimization` block load on ONNX Runtime and the model answers (GPU-only ones accepted
/// on this CPU host); what Triton refuses is refused with its message, naming the field; and an
/// accelerator Wisp cannot run refuses the model rather than running it on the CPU unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritons_onnxruntime_settings_load_or_are_refused_by_name() {
    let repo = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(fixture_repo().join("add_sub/config.pbtxt")).unwrap();
    let param = |k: &str, v: &str| {
        format!("parameters {{ key: \"{k}\" value {{ string_value: \"{v}\" }} }}\n")
    };
    let models = [
        (
            "all_settings",
            [
                param("intra_op_thread_count", "1"),
                param("inter_op_thread_count", "1"),
                param("execution_mode", "1"),
                param("enable_mem_arena", "true"),
                param("enable_mem_pattern", "0"),
                param("memory.enable_memory_arena_shrinkage", "cpu:0"),
                param("session.use_device_allocator_for_initializers", "1"),
                param("gpu_mem_limit", "4294967296"),
                "optimization { graph { level: -1 }\n  execution_accelerators { gpu_execution_accelerator: [ { name: \"tensorrt\" } ] } }\n".into(),
            ]
            .concat(),
        ),
        (
            "unknown_accelerator",
            "optimization { execution_accelerators { cpu_execution_accelerator: [ { name: \"npu9000\" } ] } }\n".into(),
        ),
        (
            "openvino",
            "optimization { execution_accelerators { cpu_execution_accelerator: [ { name: \"openvino\" } ] } }\n".into(),
        ),
        ("bad_mode", param("execution_mode", "2")),
        (
            "shrink_no_arena",
            [
                param("enable_mem_arena", "off"),
                param("memory.enable_memory_arena_shrinkage", "cpu:0"),
            ]
            .concat(),
        ),
    ];
    for (name, extra) in &models {
        let dir = repo.path().join(name);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::copy(
            fixture_repo().join("add_sub/1/model.onnx"),
            dir.join("1/model.onnx"),
        )
        .unwrap();
        let config = base.replace("name: \"add_sub\"", &format!("name: \"{name}\""));
        std::fs::write(dir.join("config.pbtxt"), config + extra).unwrap();
    }
    let server = start(repo.path(), OnnxEngine::Onnxruntime).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let a: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let r = c
        .post_json(
            "/v2/models/all_settings/infer",
            &json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": a},
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
            ]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"][3], json!(4.0));

    let idx = c
        .send("POST", "/v2/repository/index", &[], "{}")
        .await
        .unwrap()
        .json();
    let reason = |name: &str| {
        let row = idx
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {idx}"));
        assert_eq!(row["state"], "UNAVAILABLE", "{row}");
        row["reason"].as_str().unwrap().to_string()
    };
    let r = reason("unknown_accelerator");
    assert!(
        r.contains("optimization.execution_accelerators.cpu_execution_accelerator")
            && r.contains("unknown Execution Accelerator 'npu9000' is requested"),
        "{r}"
    );
    let r = reason("openvino");
    assert!(
        r.contains("'openvino'") && r.contains("OpenVINO provider"),
        "{r}"
    );
    let r = reason("shrink_no_arena");
    assert!(
        r.contains("parameters.memory.enable_memory_arena_shrinkage")
            && r.contains("enable_mem_arena"),
        "{r}"
    );
    let r = reason("bad_mode");
    assert!(
        r.contains("parameters.execution_mode") && r.contains("Invalid execution mode"),
        "{r}"
    );
    server.shutdown().await.unwrap();
}

/// `onnx.engine` picks one model's engine over the server's: a tiny model can run on tract
/// (2.4x less compute than ONNX Runtime for add_sub, benches/2026-12-07-tiny-onnx.md) beside
/// models that run on ONNX Runtime, with the same answers; a model that asks for ONNX Runtime
/// where the server has none is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_may_choose_its_engine() {
    let dir = tempfile::tempdir().unwrap();
    for (name, engine) in [
        ("plain", None),
        ("on_tract", Some("tract")),
        ("on_ort", Some("onnxruntime")),
    ] {
        let to = dir.path().join(name);
        wisp_tests::copy_dir(&fixture_repo().join("add_sub"), &to).unwrap();
        let mut config = std::fs::read_to_string(to.join("config.pbtxt"))
            .unwrap()
            .replace("name: \"add_sub\"", &format!("name: \"{name}\""));
        if let Some(e) = engine {
            config.push_str(&format!(
                "\nparameters {{ key: \"onnx.engine\" value {{ string_value: \"{e}\" }} }}\n"
            ));
        }
        std::fs::write(to.join("config.pbtxt"), config).unwrap();
    }
    let body = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": (0..16).map(|i| i as f32).collect::<Vec<_>>()},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]},
    ]});
    let want: Vec<f32> = (0..16).map(|i| i as f32 + 1.0).collect();

    let server = start(dir.path(), OnnxEngine::Onnxruntime).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for (model, engine) in [
        ("plain", "onnxruntime"),
        ("on_tract", "tract"),
        ("on_ort", "onnxruntime"),
    ] {
        let meta = c.get(&format!("/v2/models/{model}")).await.unwrap().json();
        assert_eq!(meta["parameters"]["engine"], engine, "{model}: {meta}");
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &body)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{model}");
        assert_eq!(r.json()["outputs"][0]["data"], json!(want), "{model}");
    }
    drop(server);

    let server = start(dir.path(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(
        wisp_tests::index_row(&mut c, "plain", None).await["state"],
        "READY"
    );
    assert_eq!(
        wisp_tests::index_row(&mut c, "on_tract", None).await["state"],
        "READY"
    );
    let refused = wisp_tests::index_row(&mut c, "on_ort", None).await;
    assert_eq!(refused["state"], "UNAVAILABLE", "{refused}");
    let reason = refused["reason"].as_str().unwrap();
    assert!(
        reason.contains("parameters.onnx.engine 'onnxruntime'") && reason.contains("tract"),
        "{reason}"
    );
}
