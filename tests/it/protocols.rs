//! HTTP and gRPC are codecs over one service: identical questions get identical answers (the
//! same data, the same message, the matching status), and a failure counts in the statistics
//! the same way whichever protocol carried it.

use serde_json::{json, Value};
use wisp_server::grpc::pb;
use wisp_server::settings::OnnxEngine;
use wisp_tests::{f32_bytes, fixture_repo, grpc_request, next_message, Client, GrpcClient};

use crate::common::start;

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
    let mut bad = wisp_tests::add_sub_grpc(vec![1, 15], 1);
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
        .unary("ModelInfer", &wisp_tests::add_sub_grpc(vec![2, 16], 2))
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

/// Calls multiplexed on one HTTP/2 connection are served side by side: while a
/// `ModelStreamInfer` call stays open, unary calls on the same connection are answered, and the
/// stream goes on answering after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_multiplexed_on_one_connection_are_served_side_by_side() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let tcp = tokio::net::TcpStream::connect(server.grpc_addr().unwrap())
        .await
        .unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let deadline = std::time::Duration::from_secs(30);

    // The stream opens first and stays open.
    let mut sender = h2.clone().ready().await.unwrap();
    let (stream_resp, mut stream_tx) = sender
        .send_request(grpc_request("ModelStreamInfer").body(()).unwrap(), false)
        .unwrap();
    let frame = wisp_tests::grpc_frame(&wisp_tests::add_sub_grpc(vec![1, 16], 1));
    stream_tx.send_data(frame.clone(), false).unwrap();
    let mut stream_body = stream_resp.await.unwrap().into_body();
    let mut buf = Vec::new();
    let first: pb::ModelStreamInferResponse =
        tokio::time::timeout(deadline, next_message(&mut stream_body, &mut buf))
            .await
            .expect("the stream answers")
            .unwrap();
    assert_eq!(first.error_message, "");

    // Unary calls on the same connection, all at once, while the stream is open.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..16usize {
        let rows = 1 + i % 2;
        let h2 = h2.clone();
        calls.spawn(async move {
            let mut sender = h2.ready().await.unwrap();
            let (resp, mut tx) = sender
                .send_request(grpc_request("ModelInfer").body(()).unwrap(), false)
                .unwrap();
            tx.send_data(
                wisp_tests::grpc_frame(&wisp_tests::add_sub_grpc(vec![rows as i64, 16], rows)),
                true,
            )
            .unwrap();
            let mut body = resp.await.unwrap().into_body();
            let mut buf = Vec::new();
            let r: pb::ModelInferResponse = next_message(&mut body, &mut buf).await.unwrap();
            let trailers = body.trailers().await.unwrap().expect("trailers");
            assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
            let sum = wisp_tests::f32_values(&r.raw_output_contents[0]);
            assert_eq!(sum, vec![2.0; 16 * rows]);
        });
    }
    let answered = tokio::time::timeout(deadline, calls.join_all())
        .await
        .expect("every unary call is answered while the stream is open");
    assert_eq!(answered.len(), 16);

    // The stream still answers, then ends cleanly when the client ends it.
    stream_tx.send_data(frame, false).unwrap();
    let second: pb::ModelStreamInferResponse =
        tokio::time::timeout(deadline, next_message(&mut stream_body, &mut buf))
            .await
            .expect("the stream answers after the unary calls")
            .unwrap();
    assert_eq!(second.error_message, "");
    let out = second.infer_response.expect("a response");
    assert_eq!(
        wisp_tests::f32_values(&out.raw_output_contents[0]),
        vec![2.0; 16]
    );
    stream_tx.send_data(bytes::Bytes::new(), true).unwrap();
    let trailers = tokio::time::timeout(deadline, stream_body.trailers())
        .await
        .expect("the stream ends")
        .unwrap()
        .expect("trailers");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    server.shutdown().await.unwrap();
}
