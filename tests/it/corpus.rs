//! The bad-input corpus: well over a hundred hostile requests over HTTP and gRPC against the real
//! `wisp` program in its own process — lying shapes, overflowing products, lying binary and
//! BYTES lengths, compression bombs, deep nesting, huge headers, malformed fields, wrong
//! methods. Each must get its status and a message naming the problem; after each the server
//! still answers a normal request; and over the whole corpus its peak RSS stays bounded.

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use wisp_server::grpc::pb;
use wisp_tests::{bytes_element, f32_bytes, fixture_repo, Client, GrpcClient};

use crate::common::{connect_when_up, peak_rss_bytes, spawn_wisp};

/// One hostile HTTP request and what it must get.
struct Case {
    what: String,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    status: u16,
    needle: String,
}

fn json_case(what: impl Into<String>, body: Value, status: u16, needle: &str) -> Case {
    Case {
        what: what.into(),
        method: "POST",
        path: "/v2/models/add_sub/infer".into(),
        headers: Vec::new(),
        body: serde_json::to_vec(&body).unwrap(),
        status,
        needle: needle.into(),
    }
}

fn good_inputs() -> Vec<Value> {
    vec![
        json!({"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]}),
        json!({"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]}),
    ]
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

fn http_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // lying shapes and overflowing products, for a known and an unknown input, three datatypes
    let shapes: [Value; 6] = [
        json!([1, 1u64 << 40]),
        json!([1u64 << 40]),
        json!([1, 1u64 << 62]),
        json!([1u64 << 62, 1u64 << 62]),
        json!([i64::MAX, 2]),
        json!([3, 1u64 << 61, 7]),
    ];
    for shape in &shapes {
        for name in ["INPUT0", "MYSTERY"] {
            for (dt, data) in [
                ("FP32", json!([1.0])),
                ("BYTES", json!(["a"])),
                ("INT64", json!([1])),
            ] {
                cases.push(json_case(
                    format!("lying shape {shape} on {name} {dt}"),
                    json!({"inputs": [{"name": name, "datatype": dt, "shape": shape, "data": data}]}),
                    400,
                    name,
                ));
            }
        }
    }
    // malformed fields, each named in the answer
    let field_cases: Vec<(&str, Value, &str)> = vec![
        (
            "id not a string",
            json!({"id": 5, "inputs": good_inputs()}),
            "'id'",
        ),
        (
            "parameters not an object",
            json!({"parameters": [1], "inputs": good_inputs()}),
            "'parameters'",
        ),
        (
            "binary_data_output not bool",
            json!({"parameters": {"binary_data_output": "yes"}, "inputs": good_inputs()}),
            "binary_data_output",
        ),
        ("no inputs", json!({}), "'inputs'"),
        (
            "inputs not an array",
            json!({"inputs": {"a": 1}}),
            "'inputs'",
        ),
        ("input not an object", json!({"inputs": [1]}), "inputs[0]"),
        (
            "input without name",
            json!({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}),
            "'name'",
        ),
        (
            "input without datatype",
            json!({"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": [1]}]}),
            "'datatype'",
        ),
        (
            "unknown datatype",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP128", "shape": [1, 16], "data": [1]}]}),
            "FP128",
        ),
        (
            "wrong datatype",
            json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1]}]}),
            "INT32",
        ),
        (
            "no shape",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1]}]}),
            "'shape'",
        ),
        (
            "negative dim",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, -16], "data": [1]}]}),
            "'shape'",
        ),
        (
            "float dim",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1.5], "data": [1]}]}),
            "'shape'",
        ),
        (
            "string dim",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["1"], "data": [1]}]}),
            "'shape'",
        ),
        (
            "neither data nor binary",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]}),
            "neither",
        ),
        (
            "data and binary",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1], "parameters": {"binary_data_size": 4}}]}),
            "both",
        ),
        (
            "string in FP32 data",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": ["x"]}]}),
            "data[0]",
        ),
        (
            "null in data",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [null]}]}),
            "data[0]",
        ),
        (
            "object in data",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [{}]}]}),
            "data[0]",
        ),
        (
            "more data than shape",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1, 2]}]}),
            "more elements",
        ),
        (
            "fewer data than shape",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1, 2]}]}),
            "needs 16",
        ),
        (
            "batch too large",
            json!({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [99, 16], "data": vec![1.0f32; 99 * 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [99, 16], "data": vec![1.0f32; 99 * 16]}]}),
            "batch size 99",
        ),
        (
            "input given twice",
            json!({"inputs": [good_inputs()[0].clone(), good_inputs()[0].clone(), good_inputs()[1].clone()]}),
            "more than once",
        ),
        (
            "missing input",
            json!({"inputs": [good_inputs()[0].clone()]}),
            "INPUT1",
        ),
        (
            "unknown output",
            json!({"inputs": good_inputs(), "outputs": [{"name": "NOPE"}]}),
            "NOPE",
        ),
        (
            "outputs not an array",
            json!({"inputs": good_inputs(), "outputs": 1}),
            "'outputs'",
        ),
        (
            "output without name",
            json!({"inputs": good_inputs(), "outputs": [{}]}),
            "'name'",
        ),
        (
            "classification zero",
            json!({"inputs": good_inputs(), "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 0}}]}),
            "classification",
        ),
        (
            "classification 2^62",
            json!({"inputs": good_inputs(), "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1u64 << 62}}]}),
            "classification",
        ),
        (
            "binary_data not bool",
            json!({"inputs": good_inputs(), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]}),
            "binary_data",
        ),
        (
            "shared memory without byte size",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"shared_memory_region": "r"}}]}),
            "shared_memory_byte_size",
        ),
        (
            "shared memory byte size 2^64-1",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": u64::MAX, "shared_memory_offset": u64::MAX}}]}),
            "INPUT0",
        ),
        (
            "deeply nested data",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
            "data": serde_json::from_str::<Value>(&format!("{}1{}", "[".repeat(100), "]".repeat(100))).unwrap_or(json!(null))}]}),
            "INPUT0",
        ),
        (
            "FP32 overflow to inf, wrong shape",
            json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1e39]}]}),
            "INPUT0",
        ),
    ];
    for (what, body, needle) in field_cases {
        let status = if what == "shared memory byte size 2^64-1" {
            404 // no region of that name
        } else {
            400
        };
        cases.push(json_case(what, body, status, needle));
    }
    // raw JSON that serde cannot even parse, or nests past any sane depth
    for (what, text, needle) in [
        (
            "truncated JSON",
            r#"{"inputs": ["#.to_string(),
            "malformed JSON",
        ),
        ("not JSON", "hello".to_string(), "malformed JSON"),
        ("root is an array", "[1, 2]".to_string(), "JSON object"),
        ("root nests 100000 deep", "[".repeat(100_000), "JSON object"),
        (
            "object nests 5000 deep",
            r#"{"a":"#.repeat(5000),
            "malformed JSON",
        ),
        ("empty body", String::new(), "malformed JSON"),
        ("NUL bytes", "\0\0\0".to_string(), "malformed JSON"),
    ] {
        cases.push(Case {
            what: what.into(),
            method: "POST",
            path: "/v2/models/add_sub/infer".into(),
            headers: Vec::new(),
            body: text.into_bytes(),
            status: 400,
            needle: needle.into(),
        });
    }
    // lying binary lengths
    let header = |size: Value| {
        serde_json::to_vec(&json!({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": size}},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": vec![1.0f32; 16]}]}))
        .unwrap()
    };
    for (size, needle) in [
        (json!(65), "binary_data_size"),
        (json!(1u64 << 32), "binary_data_size"),
        (json!(u64::MAX), "binary_data_size"),
        (json!(-1), "binary_data_size"),
        (json!("64"), "binary_data_size"),
        (json!(60), "expected 64 bytes"),
    ] {
        let mut body = header(size.clone());
        let n = body.len();
        body.extend(vec![0u8; 64]);
        let (body, n) = if needle == "expected 64 bytes" {
            (body[..n + 60].to_vec(), n)
        } else {
            (body, n)
        };
        cases.push(Case {
            what: format!("binary_data_size {size}"),
            method: "POST",
            path: "/v2/models/add_sub/infer".into(),
            headers: vec![("inference-header-content-length", n.to_string())],
            body,
            status: 400,
            needle: needle.into(),
        });
    }
    for (value, needle) in [
        ("99999999", "Inference-Header-Content-Length"),
        ("-5", "Inference-Header-Content-Length"),
        ("abc", "Inference-Header-Content-Length"),
        ("18446744073709551616", "Inference-Header-Content-Length"),
    ] {
        cases.push(Case {
            what: format!("header length {value}"),
            method: "POST",
            path: "/v2/models/add_sub/infer".into(),
            headers: vec![("inference-header-content-length", value.into())],
            body: b"{}".to_vec(),
            status: 400,
            needle: needle.into(),
        });
    }
    cases.push(Case {
        what: "unclaimed binary tail".into(),
        method: "POST",
        path: "/v2/models/add_sub/infer".into(),
        headers: vec![("inference-header-content-length", "2".into())],
        body: b"{}trailing".to_vec(),
        status: 400,
        needle: "'inputs'".into(),
    });
    cases.push(Case {
        what: "raw body for a two-input model".into(),
        method: "POST",
        path: "/v2/models/add_sub/infer".into(),
        headers: vec![("inference-header-content-length", "0".into())],
        body: f32_bytes(&[1.0; 16]),
        status: 400,
        needle: "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model configuration".into(),
    });
    // lying BYTES lengths, on the strings model
    for (what, payload, needle) in [
        (
            "BYTES length past the end",
            [&u32::MAX.to_le_bytes()[..], b"ab"].concat(),
            "truncated",
        ),
        ("BYTES length prefix cut", vec![1u8, 0], "truncated"),
        (
            "BYTES one element for two",
            bytes_element(b"hello"),
            "expected 2 string elements for inference input",
        ),
        (
            "BYTES three elements for two",
            [
                bytes_element(b"a"),
                bytes_element(b"b"),
                bytes_element(b"c"),
            ]
            .concat(),
            "unexpected number of string elements 3 for inference input 'text' for model 'strings', expecting 2",
        ),
    ] {
        let header = serde_json::to_vec(&json!({"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1, 2], "parameters": {"binary_data_size": payload.len()}}]}))
        .unwrap();
        let n = header.len();
        let mut body = header;
        body.extend(&payload);
        cases.push(Case {
            what: what.into(),
            method: "POST",
            path: "/v2/models/strings/infer".into(),
            headers: vec![("inference-header-content-length", n.to_string())],
            body,
            status: 400,
            needle: needle.into(),
        });
    }
    // compression: bombs past the size limit, broken streams, unknown codings
    let bomb = gzip(&vec![b' '; 3 << 20]);
    cases.push(Case {
        what: "gzip bomb".into(),
        method: "POST",
        path: "/v2/models/add_sub/infer".into(),
        headers: vec![("content-encoding", "gzip".into())],
        body: bomb,
        status: 413,
        needle: "--http-max-input-size".into(),
    });
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&vec![b'['; 3 << 20]).unwrap();
    cases.push(Case {
        what: "deflate bomb".into(),
        method: "POST",
        path: "/v2/models/add_sub/infer".into(),
        headers: vec![("content-encoding", "deflate".into())],
        body: z.finish().unwrap(),
        status: 413,
        needle: "--http-max-input-size".into(),
    });
    for (what, coding, body, status, needle) in [
        (
            "broken gzip",
            "gzip",
            b"\x1f\x8bnot really".to_vec(),
            400,
            "decompress",
        ),
        (
            "unknown coding",
            "br",
            b"{}".to_vec(),
            501,
            "Content-Encoding",
        ),
    ] {
        cases.push(Case {
            what: what.into(),
            method: "POST",
            path: "/v2/models/add_sub/infer".into(),
            headers: vec![("content-encoding", coding.into())],
            body,
            status,
            needle: needle.into(),
        });
    }
    // routes and methods
    for (what, method, path, status, needle) in [
        (
            "unknown model",
            "POST",
            "/v2/models/nope/infer",
            404,
            "nope",
        ),
        (
            "unknown version",
            "GET",
            "/v2/models/add_sub/versions/9",
            404,
            "'add_sub' version 9 is not found",
        ),
        (
            "bad version",
            "GET",
            "/v2/models/add_sub/versions/x",
            400,
            "non-negative integer",
        ),
        (
            "huge version",
            "GET",
            "/v2/models/add_sub/versions/99999999999999999999999",
            400,
            "non-negative integer",
        ),
        (
            "wrong method on infer",
            "GET",
            "/v2/models/add_sub/infer",
            405,
            "POST",
        ),
        (
            "wrong method on metadata",
            "DELETE",
            "/v2/models/add_sub",
            405,
            "GET",
        ),
        (
            "unknown action",
            "GET",
            "/v2/models/add_sub/explode",
            404,
            "explode",
        ),
        ("unknown path", "GET", "/v3/anything", 404, "no route"),
        (
            "load in none mode",
            "POST",
            "/v2/repository/models/add_sub/load",
            503,
            "explicit",
        ),
        (
            "unload in none mode",
            "POST",
            "/v2/repository/models/add_sub/unload",
            503,
            "explicit",
        ),
        (
            "named repository",
            "POST",
            "/v2/repository/other/models/add_sub/load",
            501,
            "repository_name",
        ),
        ("logging garbage", "POST", "/v2/logging", 400, "log"),
    ] {
        cases.push(Case {
            what: what.into(),
            method,
            path: path.into(),
            headers: Vec::new(),
            body: if path == "/v2/logging" {
                br#"{"log_verbose_level": "loud"}"#.to_vec()
            } else {
                Vec::new()
            },
            status,
            needle: needle.into(),
        });
    }
    cases
}

fn grpc_request(inputs: Vec<(&str, &str, Vec<i64>, Vec<u8>)>) -> pb::ModelInferRequest {
    let mut req = pb::ModelInferRequest {
        model_name: "add_sub".into(),
        ..Default::default()
    };
    for (name, dt, shape, raw) in inputs {
        req.inputs.push(pb::model_infer_request::InferInputTensor {
            name: name.into(),
            datatype: dt.into(),
            shape,
            ..Default::default()
        });
        req.raw_input_contents.push(raw.into());
    }
    req
}

fn grpc_cases() -> Vec<(String, pb::ModelInferRequest, i32, String)> {
    let mut cases = Vec::new();
    let four = f32_bytes(&[1.0]);
    for shape in [
        vec![1, 1 << 40],
        vec![1 << 62, 1 << 62],
        vec![i64::MAX, 2],
        vec![1, -16],
        vec![-1],
    ] {
        for name in ["INPUT0", "MYSTERY"] {
            cases.push((
                format!("gRPC lying shape {shape:?} on {name}"),
                grpc_request(vec![(name, "FP32", shape.clone(), four.clone())]),
                3,
                if shape.iter().any(|&d| d < 0) {
                    "negative".to_string()
                } else {
                    name.to_string()
                },
            ));
        }
    }
    let good = f32_bytes(&[1.0; 16]);
    let mut mismatch = grpc_request(vec![("INPUT0", "FP32", vec![1, 16], good.clone())]);
    mismatch.raw_input_contents.push(good.clone().into());
    cases.push((
        "raw contents count".into(),
        mismatch,
        3,
        "raw_input_contents".into(),
    ));
    let mut fp16 = grpc_request(vec![]);
    fp16.inputs.push(pb::model_infer_request::InferInputTensor {
        name: "INPUT0".into(),
        datatype: "FP16".into(),
        shape: vec![1, 16],
        contents: Some(Default::default()),
        ..Default::default()
    });
    cases.push((
        "FP16 in typed contents".into(),
        fp16,
        3,
        "raw_input_contents".into(),
    ));
    cases.push((
        "bad datatype".into(),
        grpc_request(vec![("INPUT0", "FLOAT", vec![1, 16], good.clone())]),
        3,
        "FLOAT".into(),
    ));
    cases.push((
        "wrong datatype".into(),
        grpc_request(vec![
            ("INPUT0", "INT32", vec![1, 16], good.clone()),
            ("INPUT1", "FP32", vec![1, 16], good.clone()),
        ]),
        3,
        "INT32".into(),
    ));
    cases.push((
        "BYTES length past the end".into(),
        grpc_request(vec![(
            "INPUT0",
            "BYTES",
            vec![1, 1],
            [&u32::MAX.to_le_bytes()[..], b"x"].concat(),
        )]),
        3,
        "truncated".into(),
    ));
    let mut unknown = grpc_request(vec![("INPUT0", "FP32", vec![1, 16], good.clone())]);
    unknown.model_name = "nope".into();
    cases.push(("unknown model".into(), unknown, 5, "nope".into()));
    let mut class = grpc_request(vec![
        ("INPUT0", "FP32", vec![1, 16], good.clone()),
        ("INPUT1", "FP32", vec![1, 16], good),
    ]);
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "classification".to_string(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(1 << 62)),
        },
    );
    class
        .outputs
        .push(pb::model_infer_request::InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            parameters,
        });
    cases.push((
        "classification 2^62".into(),
        class,
        3,
        "classification".into(),
    ));
    let big = grpc_request(vec![("INPUT0", "FP32", vec![1, 16], vec![0u8; 2 << 20])]);
    cases.push(("message over the limit".into(), big, 8, String::new()));
    cases
}

async fn normal(c: &mut Client) {
    let r = c
        .post_json(
            "/v2/models/add_sub/infer",
            &json!({"inputs": good_inputs()}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_input_corpus_gets_clear_errors_and_bounded_memory() {
    let limit = (1 << 20).to_string();
    let child = spawn_wisp(
        &fixture_repo(),
        &[
            "--http-max-input-size",
            &limit,
            "--grpc-max-message-size",
            &limit,
        ],
        None,
    );
    let (pid, addr, gaddr) = (child.pid(), child.http, child.grpc);
    let mut c = connect_when_up(addr).await;
    normal(&mut c).await;
    let before = peak_rss_bytes(pid);
    let http = http_cases();
    let n_http = http.len();
    let mut failures = Vec::new();
    for case in http {
        let r = c
            .send(
                case.method,
                &case.path,
                &case.headers,
                Bytes::from(case.body),
            )
            .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("{}: no answer ({e})", case.what),
        };
        let text = String::from_utf8_lossy(&r.body).to_string();
        if r.status != case.status || !text.contains(&case.needle) {
            failures.push(format!(
                "{}: got {} '{text}', want {} with '{}'",
                case.what, r.status, case.status, case.needle
            ));
        }
        // some errors close the connection (hyper does after a body it did not read)
        c = match Client::connect(addr).await {
            Ok(c) => c,
            Err(e) => panic!("{}: the server stopped accepting ({e})", case.what),
        };
        normal(&mut c).await;
    }
    // a body announced over the limit is refused before it is read
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        raw.write_all(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n{",
        )
        .await
        .unwrap();
        let mut reply = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut reply))
            .await
            .expect("an answer in time")
            .unwrap();
        let reply = String::from_utf8_lossy(&reply[..n]).to_string();
        if !(reply.starts_with("HTTP/1.1 413") && reply.contains("--http-max-input-size")) {
            failures.push(format!("body over the limit: got '{reply}'"));
        }
    }
    // a header block past the limit
    let r = c
        .send(
            "GET",
            "/v2/health/live",
            &[("x-junk", "j".repeat(512 << 10))],
            "",
        )
        .await;
    assert!(r.map(|r| r.status == 431).unwrap_or(true), "huge headers");
    c = Client::connect(addr).await.unwrap();
    normal(&mut c).await;
    let grpc = grpc_cases();
    let n_grpc = grpc.len();
    for (what, req, code, needle) in grpc {
        let mut g = GrpcClient::connect(gaddr).await.unwrap();
        let (got, msg) = g
            .unary::<_, pb::ModelInferResponse>("ModelInfer", &req)
            .await
            .unwrap()
            .expect_err(&what);
        if got != code || !msg.contains(&needle) {
            failures.push(format!(
                "{what}: got {got} '{msg}', want {code} with '{needle}'"
            ));
        }
        normal(&mut c).await;
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let total = n_http + n_grpc + 2;
    assert!(total >= 100, "the corpus has only {total} cases");
    let grew = peak_rss_bytes(pid).saturating_sub(before);
    eprintln!("corpus: {total} cases, peak RSS grew by {} MB", grew >> 20);
    assert!(
        grew < 64 << 20,
        "peak RSS grew by {} MB over the corpus",
        grew >> 20
    );
    drop(child);
}

/// With the usual systemd limit of 1024 descriptors lowered to 256, a flood of idle
/// connections (far more than the cap) neither stops the server nor locks out health checks:
/// excess connections are closed on arrival, and once they have idled a second a new one
/// evicts the idlest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_flood_at_a_low_fd_limit_does_not_lock_out_health_checks() {
    let child = spawn_wisp(&fixture_repo(), &[], Some(256));
    let addr = child.http;
    let mut c = connect_when_up(addr).await;
    drop(c);
    let mut flood = Vec::new();
    for _ in 0..400 {
        if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
            flood.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..5 {
        let start = Instant::now();
        let mut h = tokio::time::timeout(Duration::from_secs(5), Client::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let r = tokio::time::timeout(Duration::from_secs(5), h.get("/v2/health/live"))
            .await
            .expect("health answers in time")
            .expect("health answers");
        assert_eq!(r.status, 200);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "health took {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    c = Client::connect(addr).await.unwrap();
    normal(&mut c).await;
    drop(flood);
    drop(child);
}
