//! The KServe v2 HTTP surface: metadata, config, readiness, errors, limits, extensions.

use std::io::Write;

use serde_json::{json, Value};
use wisp_server::settings::OnnxEngine;
use wisp_tests::{copy_dir, f32_bytes, f32_values, fixture_repo, Client};

use crate::common::{start, start_with};

fn add_sub_request(rows: usize) -> Value {
    let data: Vec<f32> = (0..rows * 16).map(|i| i as f32).collect();
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 16], "data": data},
            {"name": "INPUT1", "datatype": "FP32", "shape": [rows, 16], "data": data},
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_model_metadata_and_config() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(c.get("/v2/health/live").await.unwrap().status, 200);
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);
    let meta = c.get("/v2").await.unwrap().json();
    assert_eq!(meta["name"], "wisp");
    let ext: Vec<&str> = meta["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(ext.contains(&"binary_tensor_data") && ext.contains(&"classification"));

    // classifier has only a labels file in its config: the rest is auto-completed from ONNX
    let m = c.get("/v2/models/classifier").await.unwrap().json();
    assert_eq!(m["name"], "classifier");
    assert_eq!(m["versions"], json!(["1"]));
    assert_eq!(m["platform"], "onnxruntime_onnx");
    assert_eq!(
        m["inputs"],
        json!([{"name": "x", "datatype": "FP32", "shape": [-1, 8]}])
    );
    assert_eq!(
        m["outputs"],
        json!([{"name": "probs", "datatype": "FP32", "shape": [-1, 4]}])
    );
    assert_eq!(m["parameters"]["engine"], "tract");
    assert_eq!(
        c.get("/v2/models/classifier/versions/1")
            .await
            .unwrap()
            .status,
        200
    );

    let cfg = c.get("/v2/models/classifier/config").await.unwrap().json();
    assert_eq!(cfg["max_batch_size"], 4);
    assert_eq!(cfg["input"][0]["dims"], json!([8]));
    assert_eq!(cfg["input"][0]["data_type"], "TYPE_FP32");
    assert_eq!(cfg["output"][0]["label_filename"], "labels.txt");
    assert_eq!(cfg["instance_group"][0]["kind"], "KIND_CPU");
    assert_eq!(cfg["version_policy"]["latest"]["num_versions"], 1);

    // fixed first dim: not batching
    let cfg = c.get("/v2/models/no_batch/config").await.unwrap().json();
    assert_eq!(cfg["max_batch_size"], 0);
    assert_eq!(cfg["input"][0]["dims"], json!([2, 3]));

    assert_eq!(c.get("/v2/models/add_sub/ready").await.unwrap().status, 200);
    assert_eq!(
        c.get("/v2/models/add_sub/versions/1/ready")
            .await
            .unwrap()
            .status,
        200
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let server = start_with(&fixture_repo(), OnnxEngine::Tract, |s| {
        s.http_max_input_size = 4096
    })
    .await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let check = |r: wisp_tests::Reply, status: u16, needle: &str| {
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "'{msg}' lacks '{needle}'");
    };
    check(
        c.get("/v2/models/nope").await.unwrap(),
        404,
        "Request for unknown model: 'nope' is not found",
    );
    check(
        c.post_json("/v2/models/nope/infer", &add_sub_request(1))
            .await
            .unwrap(),
        404,
        "nope",
    );
    check(
        c.get("/v2/models/add_sub/versions/7").await.unwrap(),
        404,
        "Request for unknown model: 'add_sub' version 7 is not found",
    );
    check(
        c.get("/v2/models/add_sub/versions/x/config").await.unwrap(),
        400,
        "not a non-negative integer",
    );
    check(c.get("/v2/nothing").await.unwrap(), 404, "no route");
    check(
        c.send("POST", "/v2/models/add_sub/infer", &[], "{\"inputs\": [")
            .await
            .unwrap(),
        400,
        "malformed JSON",
    );
    check(
        c.send("GET", "/v2/models/add_sub/infer", &[], "")
            .await
            .unwrap(),
        405,
        "use POST",
    );
    let mut bad = add_sub_request(1);
    bad["inputs"][0]["shape"] = json!([1, 15]);
    check(
        c.post_json("/v2/models/add_sub/infer", &bad).await.unwrap(),
        400,
        "INPUT0",
    );
    let mut bad = add_sub_request(1);
    bad["inputs"][1]["datatype"] = json!("INT32");
    check(
        c.post_json("/v2/models/add_sub/infer", &bad).await.unwrap(),
        400,
        "'INPUT1' data-type is 'INT32'",
    );
    check(
        c.post_json("/v2/models/add_sub/infer", &add_sub_request(9))
            .await
            .unwrap(),
        400,
        "batch size 9",
    );
    // truncated binary body
    let header = json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}]});
    let mut body = serde_json::to_vec(&header).unwrap();
    let n = body.len();
    body.extend(vec![0u8; 100]);
    check(
        c.send(
            "POST",
            "/v2/models/add_sub/infer",
            &[("inference-header-content-length", n.to_string())],
            body,
        )
        .await
        .unwrap(),
        400,
        "only 36 bytes",
    );
    check(
        c.send(
            "POST",
            "/v2/models/add_sub/infer",
            &[("inference-header-content-length", "abc".into())],
            "{}",
        )
        .await
        .unwrap(),
        400,
        "Inference-Header-Content-Length",
    );
    // over --http-max-input-size
    check(
        c.send("POST", "/v2/models/add_sub/infer", &[], vec![b' '; 5000])
            .await
            .unwrap(),
        413,
        "--http-max-input-size",
    );
    // a gzip bomb is cut at the limit
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 1 << 20]).unwrap();
    check(
        c.send(
            "POST",
            "/v2/models/add_sub/infer",
            &[("content-encoding", "gzip".into())],
            gz.finish().unwrap(),
        )
        .await
        .unwrap(),
        413,
        "--http-max-input-size",
    );
    // the server is still fine
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    server.shutdown().await.unwrap();
}

/// A JSON infer whose `shape` claims far more elements than its `data` holds once aborted the
/// whole process (the decoder reserved memory from the shape). Now each is a 400 naming the
/// input, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_shapes_get_400_and_never_kill_the_server() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    for (name, datatype, shape, data) in [
        ("INPUT0", "FP32", json!([1, 1u64 << 40]), json!([1.0])),
        ("INPUT0", "FP32", json!([1u64 << 40]), json!([1.0])),
        ("whatever", "FP32", json!([1u64 << 40]), json!([1.0])),
        ("whatever", "BYTES", json!([1u64 << 40]), json!(["a"])),
        ("INPUT0", "FP32", json!([1, 1u64 << 62]), json!([1.0])),
        ("whatever", "BYTES", json!([1u64 << 62]), json!(["a"])),
        ("INPUT0", "FP32", json!([i64::MAX, i64::MAX]), json!([1.0])),
    ] {
        let body =
            json!({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]});
        let r = c
            .post_json("/v2/models/add_sub/infer", &body)
            .await
            .unwrap();
        assert_eq!(
            r.status,
            400,
            "{shape}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(
            msg.contains(name),
            "{shape}: '{msg}' does not name the input"
        );
    }
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_classification_and_raw_binary() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let json_body = serde_json::to_vec(&add_sub_request(1)).unwrap();
    for (enc, body) in [
        ("gzip", {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&json_body).unwrap();
            e.finish().unwrap()
        }),
        ("deflate", {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&json_body).unwrap();
            e.finish().unwrap()
        }),
    ] {
        let r = c
            .send(
                "POST",
                "/v2/models/add_sub/infer",
                &[("content-encoding", enc.into())],
                body,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{enc}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["outputs"][0]["data"][3], 6.0);
    }

    // classification with labels, top-2 per row, and a requested output subset
    let x: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) / 4.0).collect();
    let req = json!({
        "id": "cls-1",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": x}],
        "outputs": [{"name": "probs", "parameters": {"classification": 2}}]
    });
    let r = c
        .post_json("/v2/models/classifier/infer", &req)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["id"], "cls-1");
    let out = &body["outputs"][0];
    assert_eq!(out["datatype"], "BYTES");
    assert_eq!(out["shape"], json!([2, 2]));
    for item in out["data"].as_array().unwrap() {
        let parts: Vec<&str> = item.as_str().unwrap().split(':').collect();
        assert_eq!(parts.len(), 3, "{item}");
        assert!(["cat", "dog", "bird", "fish"].contains(&parts[2]), "{item}");
    }
    // raw binary body: the one input's bytes, batch 1, outputs binary
    let raw: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
    let r = c
        .send(
            "POST",
            "/v2/models/classifier/infer",
            &[("inference-header-content-length", "0".into())],
            f32_bytes(&raw),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let n: usize = r.headers["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let head: Value = serde_json::from_slice(&r.body[..n]).unwrap();
    assert_eq!(head["outputs"][0]["shape"], json!([1, 4]));
    let probs = f32_values(&r.body[n..]);
    assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_models_are_unavailable_and_never_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    copy_dir(&fixture_repo().join("add_sub"), &repo.join("add_sub")).unwrap();
    // bad syntax
    std::fs::create_dir_all(repo.join("bad_syntax/1")).unwrap();
    std::fs::write(
        repo.join("bad_syntax/config.pbtxt"),
        "max_batch_size: eight\n",
    )
    .unwrap();
    // valid syntax, invalid values (several errors, all reported)
    copy_dir(&fixture_repo().join("add_sub"), &repo.join("bad_values")).unwrap();
    std::fs::write(
        repo.join("bad_values/config.pbtxt"),
        "name: \"other\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: -1\ninstance_group [ { kind: KIND_GPU } ]\n",
    )
    .unwrap();
    // no model file in the version directory
    std::fs::create_dir_all(repo.join("no_file/1")).unwrap();
    std::fs::write(repo.join("no_file/config.pbtxt"), "platform: \"onnxruntime_onnx\"\nmax_batch_size: 1\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n").unwrap();
    // not an ONNX file
    std::fs::create_dir_all(repo.join("garbage/1")).unwrap();
    std::fs::write(
        repo.join("garbage/1/model.onnx"),
        b"definitely not protobuf",
    )
    .unwrap();

    let server = start(repo, OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(
        c.post_json("/v2/models/add_sub/infer", &add_sub_request(2))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        c.get("/v2/health/ready").await.unwrap().status,
        503,
        "strict readiness"
    );
    for (model, needles) in [
        ("bad_syntax", vec!["config.pbtxt:1:17"]),
        (
            "bad_values",
            vec![
                "name: 'other' does not match",
                "max_batch_size: must be in 0..=65536, got -1",
                "instance_group[0].kind: KIND_GPU",
            ],
        ),
        ("no_file", vec!["not found"]),
        ("garbage", vec!["cannot read ONNX file"]),
    ] {
        assert_eq!(
            c.get(&format!("/v2/models/{model}/ready"))
                .await
                .unwrap()
                .status,
            400,
            "{model}"
        );
        let r = c
            .post_json(&format!("/v2/models/{model}/infer"), &add_sub_request(1))
            .await
            .unwrap();
        assert_eq!(r.status, 503, "{model}");
        let msg = r.json()["error"].as_str().unwrap().to_string();
        for n in needles {
            assert!(msg.contains(n), "{model}: '{msg}' lacks '{n}'");
        }
    }
    server.shutdown().await.unwrap();

    let server = start_with(repo, OnnxEngine::Tract, |s| s.strict_readiness = false).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_policy_serves_the_selected_versions() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("add_sub");
    copy_dir(&fixture_repo().join("add_sub"), &m).unwrap();
    copy_dir(&m.join("1"), &m.join("2")).unwrap();
    copy_dir(&m.join("1"), &m.join("3")).unwrap();
    let cfg = std::fs::read_to_string(m.join("config.pbtxt")).unwrap();
    std::fs::write(
        m.join("config.pbtxt"),
        format!("{cfg}\nversion_policy: {{ latest: {{ num_versions: 2 }} }}\n"),
    )
    .unwrap();
    let server = start(dir.path(), OnnxEngine::Tract).await;
    let mut c = Client::connect(server.http_addr()).await.unwrap();
    let meta = c.get("/v2/models/add_sub").await.unwrap().json();
    assert_eq!(meta["versions"], json!(["2", "3"]));
    assert_eq!(
        c.get("/v2/models/add_sub/versions/1/ready")
            .await
            .unwrap()
            .status,
        400
    );
    let r = c
        .post_json("/v2/models/add_sub/versions/2/infer", &add_sub_request(1))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "2");
    let r = c
        .post_json("/v2/models/add_sub/infer", &add_sub_request(1))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "3");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests() {
    let server = start(&fixture_repo(), OnnxEngine::Tract).await;
    let addr = server.http_addr();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = Client::connect(addr).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..20 {
                match c
                    .post_json("/v2/models/add_sub/infer", &add_sub_request(4))
                    .await
                {
                    Ok(r) => {
                        assert_eq!(
                            r.status, 200,
                            "a request accepted before shutdown must succeed"
                        );
                        assert_eq!(r.json()["outputs"].as_array().unwrap().len(), 2);
                        ok += 1;
                    }
                    Err(_) => break, // connection closed by the shutdown: allowed between requests
                }
            }
            ok
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    server.shutdown().await.unwrap();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total > 0, "some requests were served");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}
