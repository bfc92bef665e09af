//! Property-based fuzzing of everything that decodes a request from the network: the HTTP JSON
//! and binary-extension decoder, raw binary bodies, tensor `data` text, the gRPC
//! `ModelInferRequest` decoding (from arbitrary protobuf bytes and from structured requests with
//! lying shapes and lengths, typed contents included), shared-memory parameters and the windows
//! they name, and OpenAI embeddings bodies. Each must answer with a request or an error, never a panic or an
//! allocation sized from a claim; a decoded request always holds exactly the bytes its shape
//! calls for.
//!
//! CI runs a short fixed-seed pass; `./dev fuzz` runs millions of cases (`PROPTEST_CASES`,
//! `PROPTEST_RNG_SEED` override both).

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{json, Value};
use wisp_core::config::{normalize, parse_pbtxt, Signature};
use wisp_core::{DataType, Tensor};

use crate::grpc::pb;
use crate::http::codec;

fn config() -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = 512;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0xdec0_de42);
    }
    c.failure_persistence = None;
    c
}

fn model(batch: bool) -> Signature {
    let text = format!(
        r#"platform: "onnxruntime_onnx"
        max_batch_size: {}
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ] }},
                {{ name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }} ]"#,
        if batch { 4 } else { 0 }
    );
    let mut c = parse_pbtxt("m", &text).unwrap();
    normalize(&mut c, "m", std::path::Path::new("/nonexistent"));
    Signature::of(&c).unwrap()
}

const DATATYPES: &[&str] = &[
    "FP32", "FP16", "BF16", "FP64", "INT8", "INT64", "UINT8", "UINT64", "BOOL", "BYTES", "fp32", "",
];

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![
        0i64..5,
        Just(-1),
        Just(1 << 31),
        Just(1 << 40),
        Just(1 << 62),
        Just(i64::MAX),
        Just(i64::MIN),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        any::<bool>().prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::from),
        Just(Value::Null),
        Just(json!({})),
    ]
}

fn data() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Value::Array)
    })
}

fn input() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("x"), Just("s"), Just("nope"), Just("")],
        proptest::sample::select(DATATYPES),
        proptest::collection::vec(dim(), 0..4),
        proptest::option::of(data()),
        proptest::option::of(prop_oneof![0u64..64, Just(u64::MAX), Just(1 << 40)]),
    )
        .prop_map(|(name, dt, shape, data, binary)| {
            let mut o = json!({"name": name, "datatype": dt, "shape": shape});
            if let Some(d) = data {
                o["data"] = d;
            }
            if let Some(n) = binary {
                o["parameters"] = json!({ "binary_data_size": n });
            }
            o
        })
}

/// A decoded tensor holds exactly what its shape and datatype call for.
fn consistent(t: &Tensor) {
    Tensor::new(t.name.clone(), t.datatype, t.shape.clone(), t.data.clone())
        .expect("a decoded tensor is consistent");
}

fn check_http(body: Bytes, header_len: Option<usize>, batch: bool) {
    let cfg = model(batch);
    let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(1 << 30));
    let mut charge = crate::service::Charge::new(&budget);
    if let Ok(d) = codec::decode(body, header_len, &cfg, &mut charge) {
        d.request.inputs.iter().for_each(consistent);
        let _ = wisp_core::infer::validate(&d.request, &cfg);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn structured_http_requests_never_panic(
        inputs in proptest::collection::vec(input(), 0..3),
        outputs in proptest::collection::vec(
            (prop_oneof![Just("y"), Just("z")], proptest::option::of(any::<u64>())), 0..3),
        tail in proptest::collection::vec(any::<u8>(), 0..48),
        batch in any::<bool>(),
        split in any::<bool>(),
    ) {
        let outputs: Vec<Value> = outputs
            .into_iter()
            .map(|(name, class)| match class {
                Some(n) => json!({"name": name, "parameters": {"classification": n}}),
                None => json!({"name": name}),
            })
            .collect();
        let header = serde_json::to_vec(&json!({"inputs": inputs, "outputs": outputs})).unwrap();
        let n = header.len();
        let mut body = header;
        body.extend(&tail);
        check_http(body.into(), split.then_some(n), batch);
    }

    #[test]
    fn arbitrary_http_bodies_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        header_len in proptest::option::of(0usize..300),
        batch in any::<bool>(),
    ) {
        check_http(body.into(), header_len, batch);
    }

    #[test]
    fn tensor_data_text_never_panics(
        dt in proptest::sample::select(&DATATYPES[..10]),
        text in prop_oneof![data().prop_map(|d| d.to_string()), "\\PC{0,64}"],
        count in prop_oneof![0usize..8, Just(usize::MAX), Just(1 << 40)],
    ) {
        let dt = DataType::parse(dt).unwrap();
        if let Ok(bytes) = codec::json_data_decode(dt, &text, count) {
            let shape = vec![count as i64];
            Tensor::new("t", dt, shape, bytes.into()).expect("decoded data matches its count");
        }
    }

    #[test]
    fn arbitrary_grpc_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        use prost::Message;
        if let Ok(req) = pb::ModelInferRequest::decode(&bytes[..]) {
            if let Ok(d) = crate::grpc::decode(req) {
                d.request.inputs.iter().for_each(consistent);
                let _ = wisp_core::infer::validate(&d.request, &model(true));
            }
        }
    }

    #[test]
    fn structured_grpc_requests_never_panic(
        tensors in proptest::collection::vec((
            proptest::sample::select(DATATYPES),
            proptest::collection::vec(dim(), 0..4),
            proptest::collection::vec(any::<u8>(), 0..40),
            proptest::collection::vec(any::<i32>(), 0..6),
        ), 0..3),
        raw in any::<bool>(),
        class in proptest::option::of(any::<i64>()),
    ) {
        let mut req = pb::ModelInferRequest { model_name: "m".into(), ..Default::default() };
        for (i, (dt, shape, bytes, ints)) in tensors.into_iter().enumerate() {
            req.inputs.push(pb::model_infer_request::InferInputTensor {
                name: format!("t{i}"),
                datatype: dt.to_string(),
                shape,
                // Every typed field at once: the decoder takes the one the datatype names and
                // must refuse or ignore the rest, whatever their counts.
                contents: (!raw).then(|| pb::InferTensorContents {
                    int_contents: ints.clone(),
                    int64_contents: ints.iter().map(|&v| i64::from(v) << 20).collect(),
                    uint_contents: ints.iter().map(|&v| v as u32).collect(),
                    uint64_contents: ints.iter().map(|&v| u64::from(v as u32) << 20).collect(),
                    bool_contents: ints.iter().map(|&v| v & 1 == 1).collect(),
                    fp32_contents: ints.iter().map(|&v| v as f32).collect(),
                    fp64_contents: ints.iter().map(|&v| f64::from(v) / 3.0).collect(),
                    bytes_contents: vec![bytes.clone()],
                }),
                ..Default::default()
            });
            if raw {
                req.raw_input_contents.push(bytes.into());
            }
        }
        if let Some(n) = class {
            let mut parameters = std::collections::HashMap::new();
            parameters.insert("classification".to_string(), pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(n)),
            });
            req.outputs.push(pb::model_infer_request::InferRequestedOutputTensor {
                name: "y".into(),
                parameters,
            });
        }
        // The codec's pre-decode charge covers what decoding will hold, and its counts are
        // the decoded message's.
        let msg = prost::Message::encode_to_vec(&req);
        let walked = crate::grpc::codec::Survey::of(&msg);
        let decoded: u64 = msg.len() as u64
            + req.inputs.iter().filter_map(|t| t.contents.as_ref())
                .map(|c| 2 * crate::grpc::decoded_bytes(c)).sum::<u64>();
        prop_assert!(walked.cost >= decoded);
        prop_assert_eq!(walked.inputs, req.inputs.len());
        prop_assert_eq!(walked.outputs, req.outputs.len());
        prop_assert_eq!(walked.raw, req.raw_input_contents.len());
        prop_assert_eq!(
            walked.most_rank,
            req.inputs.iter().map(|t| t.shape.len()).max().unwrap_or(0)
        );
        if let Ok(d) = crate::grpc::decode(req) {
            d.request.inputs.iter().for_each(consistent);
        }
    }
}

/// A shm object of 4096 bytes for the shm property, removed on drop.
struct ShmObject(String);

impl ShmObject {
    fn new() -> Self {
        let key = format!("/wisp-fuzz-{}", std::process::id());
        std::fs::write(format!("/dev/shm{key}"), vec![7u8; 4096]).unwrap();
        ShmObject(key)
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(format!("/dev/shm{}", self.0));
    }
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..5000).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!("12")),
        Just(Value::Null),
        Just(json!([1])),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Shared-memory parameters from a request, and the windows they name in a registered
    /// 4096-byte region: an error or an exact copy, never a panic or a read past the window.
    #[test]
    fn shm_parameters_and_windows_never_panic(
        region in prop_oneof![Just(json!("r")), Just(json!("")), Just(json!(3)), Just(json!("other"))],
        offset in proptest::option::of(number()),
        size in proptest::option::of(number()),
        out_len in 0usize..5000,
    ) {
        let obj = ShmObject::new();
        let shm = crate::service::shm::SharedMemory::new("wisp-fuzz", 1 << 20);
        let scope = crate::service::shm::Scope::default();
        shm.register(&scope, "r", &obj.0, 0, 4096).unwrap();
        let mut params = serde_json::Map::new();
        params.insert("shared_memory_region".into(), region);
        if let Some(o) = offset {
            params.insert("shared_memory_offset".into(), o);
        }
        if let Some(s) = size {
            params.insert("shared_memory_byte_size".into(), s);
        }
        if let Ok(Some(at)) = crate::service::shm::shm_ref(&params, "input 'x'") {
            if let Ok(bytes) = shm.read(&scope, &at) {
                prop_assert_eq!(bytes.len(), at.byte_size);
                prop_assert!(at.offset + at.byte_size <= 4096);
            }
            let data = vec![1u8; out_len];
            if shm.write(&scope, &at, &data).is_ok() {
                prop_assert!(out_len <= at.byte_size && at.offset + out_len <= 4096);
            }
        }
    }

    /// Arbitrary bytes as an OpenAI embeddings body: parsed or refused, never a panic.
    #[test]
    fn arbitrary_embeddings_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = crate::http::openai::parse(&body);
    }

    /// Structured embeddings bodies with every field of the wrong kind in turn: a parsed body
    /// holds exactly the texts sent.
    #[test]
    fn structured_embeddings_bodies_never_panic(
        model in prop_oneof![Just(json!("m")), Just(json!("")), Just(Value::Null), Just(json!(1))],
        input in prop_oneof![
            ".{0,12}".prop_map(Value::from),
            proptest::collection::vec(".{0,6}", 0..4).prop_map(|v| json!(v)),
            proptest::collection::vec(scalar(), 0..4).prop_map(Value::Array),
            Just(json!([[1, 2], [3]])),
            Just(Value::Null),
        ],
        encoding in prop_oneof![Just(json!("float")), Just(json!("base64")), Just(json!("x")), Just(Value::Null)],
        dimensions in proptest::option::of(number()),
    ) {
        let mut body = json!({"model": model, "input": input.clone(), "encoding_format": encoding});
        if let Some(d) = dimensions {
            body["dimensions"] = d;
        }
        if let Ok(parsed) = crate::http::openai::parse(body.to_string().as_bytes()) {
            let sent: Vec<String> = match input {
                Value::String(s) => vec![s],
                Value::Array(items) => items.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
                _ => unreachable!("only strings parse"),
            };
            prop_assert_eq!(parsed.texts, sent);
        }
    }
}
