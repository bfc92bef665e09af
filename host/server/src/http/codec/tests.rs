use super::*;
use wisp_core::config::{normalize, parse_pbtxt};

/// Decodes with a budget of `MAX_PERMITS` KiB: charged, never refused.
fn decode(body: Bytes, header_len: Option<usize>, sig: &Signature) -> Result<Decoded> {
    let mut charge = Charge::new(&unbounded());
    super::decode(body, header_len, sig, &mut charge)
}

fn unbounded() -> std::sync::Arc<tokio::sync::Semaphore> {
    std::sync::Arc::new(tokio::sync::Semaphore::new(
        tokio::sync::Semaphore::MAX_PERMITS,
    ))
}

fn cfg() -> Signature {
    let mut c = parse_pbtxt(
        "m",
        r#"
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
        "#,
    )
    .unwrap();
    normalize(&mut c, "m", std::path::Path::new("/nonexistent"));
    Signature::of(&c).unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// What the client is told: a decode error, or else the service's validation error.
fn err(body: &str, header: Option<usize>) -> String {
    let checked = decode(Bytes::from(body.to_string()), header, &cfg())
        .and_then(|d| wisp_core::infer::validate(&d.request, &cfg()));
    checked.unwrap_err().message().to_string()
}

#[test]
fn json_nested_and_flat_data() {
    for data in ["[[1, 2]]", "[1, 2]"] {
        let body = format!(
            r#"{{"id":"r1","inputs":[{{"name":"x","shape":[1,2],"datatype":"FP32","data":{data}}}]}}"#
        );
        let d = decode(body.into(), None, &cfg()).unwrap();
        assert_eq!(d.request.id, "r1");
        assert_eq!(&d.request.inputs[0].data[..], &f32_bytes(&[1.0, 2.0])[..]);
    }
}

#[test]
fn binary_round_trip() {
    let json = r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#;
    let mut body = json.as_bytes().to_vec();
    body.extend(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let d = decode(body.into(), Some(json.len()), &cfg()).unwrap();
    assert_eq!(d.request.inputs[0].shape, vec![2, 2]);
    assert_eq!(d.outputs[0].binary, Some(true));
    let out = Tensor::new(
        "y",
        DataType::Fp32,
        vec![2, 3],
        f32_bytes(&[1., 2., 3., 4., 5., 6.]).into(),
    )
    .unwrap();
    let enc = encode_parts("m", 1, "", &[(d.outputs[0].clone(), out)], d.binary_default);
    let n = enc.header_len.unwrap();
    let head: Value = serde_json::from_slice(&enc.body[..n]).unwrap();
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 24);
    assert_eq!(&enc.body[n..], &f32_bytes(&[1., 2., 3., 4., 5., 6.])[..]);
}

#[test]
fn truncated_and_wrong_lengths() {
    let json = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
    let mut body = json.as_bytes().to_vec();
    body.extend([0u8; 4]); // truncated: 4 of 8 bytes
    let e = decode(body.clone().into(), Some(json.len()), &cfg()).unwrap_err();
    assert!(e.message().contains("only 4 bytes"), "{e}");
    // header length beyond the body
    let e = decode(body.clone().into(), Some(body.len() + 1), &cfg()).unwrap_err();
    assert!(
        e.message().contains("Inference-Header-Content-Length"),
        "{e}"
    );
    // leftover binary
    let mut body = json.as_bytes().to_vec();
    body.extend([0u8; 12]);
    let e = decode(body.into(), Some(json.len()), &cfg()).unwrap_err();
    assert!(e.message().contains("no input claimed"), "{e}");
    // binary size disagrees with the shape
    let json = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":4}}]}"#;
    let mut body = json.as_bytes().to_vec();
    body.extend([0u8; 4]);
    let e = decode(body.into(), Some(json.len()), &cfg()).unwrap_err();
    assert!(e.message().contains("expected 8 bytes"), "{e}");
    // header length cutting the JSON
    let e = decode(Bytes::from(json.to_string()), Some(10), &cfg()).unwrap_err();
    assert!(e.message().contains("malformed JSON"), "{e}");
}

#[test]
fn validation_names_the_field() {
    let ok = |s: &str| {
        format!(r#"{{"inputs":[{{"name":"x","shape":{s},"datatype":"FP32","data":[1,2]}}]}}"#)
    };
    assert!(err(&ok("[2]"), None).contains("Expected [-1, 2], got [2]"));
    assert!(err(&ok("[1,3]"), None).contains("'data' has 2 elements but the shape needs 3"));
    let five = r#"{"inputs":[{"name":"x","shape":[5,2],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10]}]}"#;
    assert!(err(five, None).contains("batch size 5 is outside 1..=4"));
    assert!(err(
        r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP64","data":[1,2]}]}"#,
        None
    )
    .contains("expects 'FP32'"));
    assert!(err(
        r#"{"inputs":[{"name":"z","shape":[1,2],"datatype":"FP32","data":[1,2]}]}"#,
        None
    )
    .contains("unexpected inference input 'z'"));
    assert!(err(r#"{"inputs":[]}"#, None).contains("missing input 'x'"));
    assert!(err(
        r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32"}]}"#,
        None
    )
    .contains("neither 'data'"));
    assert!(err(
        r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":["a",2]}]}"#,
        None
    )
    .contains("data[0]"));
    assert!(err(
        r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FLOAT","data":[1,2]}]}"#,
        None
    )
    .contains("unknown datatype"));
    assert!(err(
        r#"{"inputs":[{"name":"x","shape":[1,-2],"datatype":"FP32","data":[1,2]}]}"#,
        None
    )
    .contains("'shape'"));
    assert!(err(r#"{"inputs": [1"#, None).contains("malformed JSON"));
    assert!(err(r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2]}],"outputs":[{"name":"q"}]}"#, None).contains("unexpected inference output 'q'"));
}

#[test]
fn int_ranges_are_checked() {
    let e = json_data::decode(DataType::Uint8, "[256]", 1).unwrap_err();
    assert!(e.message().contains("not a valid UINT8"));
    let b = json_data::decode(DataType::Int64, "[-5]", 1).unwrap();
    assert_eq!(b, (-5i64).to_le_bytes());
    let b = json_data::decode(DataType::Bool, "[true, false]", 2).unwrap();
    assert_eq!(b, vec![1, 0]);
    let b = json_data::decode(DataType::Bytes, r#"["hi"]"#, 1).unwrap();
    assert_eq!(b, encode_bytes_elements(["hi"]));
}

#[test]
fn raw_binary_body() {
    let d = decode(f32_bytes(&[1.0, 2.0]).into(), Some(0), &cfg()).unwrap();
    assert_eq!(d.request.inputs[0].shape, vec![1, 2]);
    assert!(d.binary_default);
    let e = decode(f32_bytes(&[1.0, 2.0, 3.0]).into(), Some(0), &cfg()).unwrap_err();
    assert!(e.message().contains("expected 8 bytes"), "{e}");
}

/// Triton's QA (`HttpTest.test_byte_too_many_elements`): a raw BYTES body is one element, so
/// the input must be exactly `[1]`; a variable dimension is refused, not deduced.
#[test]
fn raw_bytes_needs_dims_of_one() {
    let sig = |dims: &str| {
        let mut c = parse_pbtxt(
            "s",
            &format!(
                r#"
                platform: "onnxruntime_onnx"
                max_batch_size: 8
                input [ {{ name: "INPUT0" data_type: TYPE_STRING dims: {dims} }} ]
                output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: {dims} }} ]
                "#
            ),
        )
        .unwrap();
        normalize(&mut c, "s", std::path::Path::new("/nonexistent"));
        Signature::of(&c).unwrap()
    };
    let d = decode(Bytes::from_static(b"427"), Some(0), &sig("[ 1 ]")).unwrap();
    assert_eq!(d.request.inputs[0].strings().unwrap(), vec![&b"427"[..]]);
    for dims in ["[ -1 ]", "[ 2 ]", "[ 1, -1 ]"] {
        let e = decode(Bytes::from_static(b"427"), Some(0), &sig(dims)).unwrap_err();
        assert!(
            e.message().starts_with(
                "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
            ),
            "{dims}: {e}"
        );
    }
}

/// Triton's QA (`HttpTest.test_buffer_size_overflow`): a count that fits an `int64_t` but whose
/// bytes do not is refused in Triton's words, before `data` is read.
#[test]
fn byte_size_overflow_is_worded_as_triton_words_it() {
    let body = r#"{"inputs":[{"name":"x","shape":[4,1152921504606846978],"datatype":"FP32","data":[1.0]}]}"#;
    let e = err(body, None);
    assert!(e.contains("byte size overflow for input 'x'"), "{e}");
    let body = r#"{"inputs":[{"name":"x","shape":[16,1152921504606846978],"datatype":"FP32","data":[1.0]}]}"#;
    let e = err(body, None);
    assert!(
        e.contains("causes total element count to exceed maximum size of"),
        "{e}"
    );
}

/// A shape is the client's claim: nothing may be sized from it before the data backs it up.
/// Each of these once aborted the process (allocation failure or capacity overflow).
#[test]
fn lying_shapes_are_rejected_without_allocating() {
    for (name, datatype, shape, data) in [
        ("x", "FP32", "[1, 1099511627776]", "[1]"),
        ("x", "FP32", "[1099511627776]", "[1]"),
        ("nope", "FP32", "[1099511627776]", "[1]"),
        ("x", "FP32", "[1, 4611686018427387904]", "[1]"),
        ("x", "FP32", "[4611686018427387904, 3]", "[1]"),
        ("nope", "BYTES", "[1099511627776]", "[\"a\"]"),
        ("nope", "BYTES", "[4611686018427387904]", "[\"a\"]"),
        (
            "x",
            "FP32",
            "[9223372036854775807, 9223372036854775807]",
            "[1]",
        ),
    ] {
        let body = format!(
            r#"{{"inputs":[{{"name":"{name}","shape":{shape},"datatype":"{datatype}","data":{data}}}]}}"#
        );
        let e = err(&body, None);
        assert!(
            e.contains(name) && (e.contains("too large") || e.contains("element")),
            "{shape}: {e}"
        );
    }
}

#[test]
fn bytes_that_are_not_utf8_go_as_binary_even_when_json_was_asked_for() {
    let spec = OutputSpec {
        name: "s".into(),
        binary: Some(false),
        classification: None,
        shm: None,
    };
    let text = wisp_core::tensor::encode_bytes_elements([&b"ok"[..], "é".as_bytes()]);
    let t = Tensor::new("s", DataType::Bytes, vec![2], text.into()).unwrap();
    let enc = encode_parts("m", 1, "", &[(spec.clone(), t)], false);
    assert_eq!(enc.header_len, None, "UTF-8 stays JSON");
    let head: Value = serde_json::from_slice(&enc.body).unwrap();
    assert_eq!(head["outputs"][0]["data"][1], "é");

    let raw = wisp_core::tensor::encode_bytes_elements([&b"ok"[..], &[0xffu8, 0x80][..]]);
    let t = Tensor::new("s", DataType::Bytes, vec![2], raw.clone().into()).unwrap();
    let enc = encode_parts("m", 1, "", &[(spec, t)], false);
    let n = enc.header_len.expect("sent as binary");
    let head: Value = serde_json::from_slice(&enc.body[..n]).unwrap();
    assert_eq!(
        head["outputs"][0]["parameters"]["binary_data_size"],
        raw.len()
    );
    assert_eq!(&enc.body[n..], &raw[..], "the bytes, unchanged");
}

#[test]
fn the_outline_is_bounded_and_charged_before_it_is_built() {
    let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(1 << 20));
    let charged = |body: String| {
        let mut charge = Charge::new(&budget);
        let r = super::decode(body.into(), None, &cfg(), &mut charge);
        (r, (1usize << 20) - budget.available_permits())
    };
    // keys the request does not use are skipped unread: nothing charged for them
    let junk = vec!["[1]"; 200_000].join(",");
    let (r, kib) = charged(format!(
        r#"{{"junk":[{junk}],"inputs":[{{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]}}]}}"#
    ));
    assert!(r.is_ok(), "{:?}", r.err());
    assert!(kib < 4, "{kib} KiB for a small outline");
    // a long shape is counted and charged, then refused by its rank
    let dims = vec!["1"; 1000].join(",");
    let (r, kib) = charged(format!(
        r#"{{"inputs":[{{"name":"x","datatype":"FP32","shape":[{dims}],"data":[1]}}]}}"#
    ));
    assert!(r.unwrap_err().message().contains("dimensions"));
    assert!(
        kib >= 1000 * 128 / 1024,
        "{kib} KiB for a thousand dimensions"
    );
    // past the bound, refused before anything is built
    let many = vec!["1"; MAX_OUTLINE_VALUES + 1].join(",");
    let (r, kib) = charged(format!(r#"{{"parameters":{{"a":[{many}]}},"inputs":[]}}"#));
    let e = r.unwrap_err();
    assert!(e.message().contains("'parameters'"), "{}", e.message());
    assert!(kib < 4, "{kib} KiB charged for what was never built");
    // a budget that cannot cover the outline refuses it (503), not after building it
    let small = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut charge = Charge::new(&small);
    let many = vec!["1"; 10_000].join(",");
    let e = super::decode(
        format!(r#"{{"id":"a","outputs":[{many}],"inputs":[]}}"#).into(),
        None,
        &cfg(),
        &mut charge,
    )
    .unwrap_err();
    assert_eq!(e.kind(), wisp_core::ErrorKind::Exhausted, "{}", e.message());
}

#[test]
fn too_many_inputs_or_outputs_are_refused() {
    let inputs = vec!["{}"; wisp_core::infer::MAX_REQUEST_TENSORS + 1].join(",");
    let e = decode(format!(r#"{{"inputs":[{inputs}]}}"#).into(), None, &cfg()).unwrap_err();
    assert!(e.message().contains("inputs"), "{}", e.message());
    let outputs = vec![r#"{"name":"y"}"#; wisp_core::infer::MAX_REQUEST_TENSORS + 1].join(",");
    let e = decode(
        format!(r#"{{"inputs":[],"outputs":[{outputs}]}}"#).into(),
        None,
        &cfg(),
    )
    .unwrap_err();
    assert!(e.message().contains("requested outputs"), "{}", e.message());
}
