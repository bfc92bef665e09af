//! HTTP and gRPC are codecs over one service: identical questions get identical answers (the
//! same data, the same message, the matching status), and a failure counts in the statistics
//! the same way whichever protocol carried it.

use serde_json::{json, Value};
use wisp_server::grpc::pb;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{f32_bytes, fixture_repo, Client, GrpcClient};

use crate::common::start;

fn grpc_infer(shape: Vec<i64>, rows: usize) -> pb::ModelInferRequest {
    let data = f32_bytes(&vec![1.0; rows * 16]);
    let input = |name: &str| pb::model_infer_request::InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: shape.clone(),
        ..Default::default()
    };
    pb::ModelInferRequest {
        model_name: "add_sub".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![data.clone().into(), data.into()],
        ..Default::default()
    }
}

fn http_infer(shape: Value, rows: usize) -> Value {
    let data = vec![1.0f32; rows * 16];
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": data},
        {"name": "INPUT1", "datatype": "FP32", "shape": shape, "data": data},
    ]})
}

async fn fail_count(c: &mut Client) -> u64 {
    let s = c.get("/v2/models/add_sub/stats").await.unwrap().json();
    s["model_stats"][0]["inference_stats"]["fail"]["count"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_grpc_answer_alike() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let mut g = GrpcClient::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();

    // metadata
    let h = c.get("/v2/models/add_sub").await.unwrap().json();
    let r: pb::ModelMetadataResponse = g
        .unary(
            "ModelMetadata",
            &pb::ModelMetadataRequest {
                name: "add_sub".into(),
                version: String::new(),
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h["name"], r.name);
    assert_eq!(h["platform"], r.platform);
    assert_eq!(h["versions"], json!(r.versions));
    for (hj, gi) in h["inputs"].as_array().unwrap().iter().zip(&r.inputs) {
        assert_eq!(hj["name"], gi.name);
        assert_eq!(hj["datatype"], gi.datatype);
        assert_eq!(hj["shape"], json!(gi.shape));
    }

    // the same errors, word for word, with matching statuses
    let unknown = c.get("/v2/models/nope").await.unwrap();
    let (code, msg) = g
        .unary::<_, pb::ModelMetadataResponse>(
            "ModelMetadata",
            &pb::ModelMetadataRequest {
                name: "nope".into(),
                version: String::new(),
            },
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!((unknown.status, code), (404, 5));
    assert_eq!(unknown.json()["error"], msg);
    assert!(
        msg.contains("Request for unknown model: 'nope' is not found"),
        "{msg}"
    );

    // readiness of an unknown model or version is "not ready", not an error (Triton's answer:
    // HTTP 400, gRPC ready=false with OK)
    for (name, version) in [("nope", ""), ("add_sub", "9"), ("add_sub", "")] {
        let path = match version {
            "" => format!("/v2/models/{name}/ready"),
            v => format!("/v2/models/{name}/versions/{v}/ready"),
        };
        let http = c.get(&path).await.unwrap().status;
        let r: pb::ModelReadyResponse = g
            .unary(
                "ModelReady",
                &pb::ModelReadyRequest {
                    name: name.into(),
                    version: version.into(),
                },
            )
            .await
            .unwrap()
            .unwrap();
        let ready = name == "add_sub" && version.is_empty();
        assert_eq!(
            (http, r.ready),
            (if ready { 200 } else { 400 }, ready),
            "{path}"
        );
    }

    let before = fail_count(&mut c).await;
    let bad_http = c
        .post_json(
            "/v2/models/add_sub/infer",
            &json!({"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 15], "data": vec![1.0f32; 15]},
                {"name": "INPUT1", "datatype": "FP32", "shape": [1, 15], "data": vec![1.0f32; 15]},
            ]}),
        )
        .await
        .unwrap();
    let mut bad = grpc_infer(vec![1, 15], 1);
    bad.raw_input_contents = vec![f32_bytes(&[1.0; 15]).into(), f32_bytes(&[1.0; 15]).into()];
    let (code, msg) = g
        .unary::<_, pb::ModelInferResponse>("ModelInfer", &bad)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!((bad_http.status, code), (400, 3));
    assert_eq!(bad_http.json()["error"], msg);
    // both failures counted, by the one writer
    assert_eq!(fail_count(&mut c).await, before + 2);

    let load = c
        .send("POST", "/v2/repository/models/add_sub/load", &[], "")
        .await
        .unwrap();
    let (code, msg) = g
        .unary::<_, pb::RepositoryModelLoadResponse>(
            "RepositoryModelLoad",
            &pb::RepositoryModelLoadRequest {
                model_name: "add_sub".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!((load.status, code), (503, 14));
    assert_eq!(load.json()["error"], msg);

    // and the same results
    let h = c
        .post_json("/v2/models/add_sub/infer", &http_infer(json!([2, 16]), 2))
        .await
        .unwrap()
        .json();
    let r: pb::ModelInferResponse = g
        .unary("ModelInfer", &grpc_infer(vec![2, 16], 2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h["outputs"][0]["name"], r.outputs[0].name);
    assert_eq!(h["outputs"][0]["shape"], json!(r.outputs[0].shape));
    let from_grpc = wisp_tests::f32_values(&r.raw_output_contents[0]);
    let from_http: Vec<f32> = h["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(from_http, from_grpc);
    server.shutdown().await.unwrap();
}
