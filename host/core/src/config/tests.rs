use super::*;

const FULL: &str = r#"
name: "resnet"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "x"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP32
    dims: [ 1000 ]
  }
]
instance_group [ { kind: KIND_CPU, count: 2 } ]
parameters: { key: "intra_op_thread_count" value: { string_value: "1" } }
sequence_batching { max_sequence_idle_microseconds: 5000 }
"#;

#[test]
fn parses_a_full_triton_config() {
    let cfg = parse_pbtxt("resnet", FULL).unwrap();
    assert_eq!(cfg.name, "resnet");
    assert_eq!(cfg.max_batch_size, 8);
    assert_eq!(cfg.input[0].dims, vec![3, 224, 224]);
    assert_eq!(cfg.input[0].data_type, Some(DataType::Fp32));
    assert_eq!(cfg.input[0].format, TensorFormat::Nchw);
    assert_eq!(cfg.output[0].dims, vec![1000]);
    assert_eq!(cfg.instance_group[0].count, 2);
    assert_eq!(cfg.parameter("intra_op_thread_count"), Some("1"));
    assert_eq!(
        cfg.version_policy
            .as_ref()
            .unwrap()
            .specific
            .as_ref()
            .unwrap()
            .versions,
        vec![1, 3]
    );
    assert!(cfg.unsupported_fields().is_empty());
    assert!(cfg.max_batch_size_set);
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let e = parse_pbtxt(
        "m",
        "name: \"m\"\nmax_batch_size: 8\ninput [ { nme: \"x\" } ]\n",
    )
    .unwrap_err();
    let s = e.to_string();
    assert!(s.contains("config.pbtxt:3:"), "{s}");
    assert!(s.contains("nme"), "{s}");
    let e = parse_pbtxt("m", "max_batch_size: \"eight\"").unwrap_err();
    assert!(e.to_string().contains("config.pbtxt:1:"), "{e}");
}

#[test]
fn json_form_has_every_field_and_numbers() {
    let mut cfg = parse_pbtxt("resnet", FULL).unwrap();
    normalize(&mut cfg, "resnet", Path::new("/nonexistent"));
    let json = config_to_json(&cfg);
    assert_eq!(json["max_batch_size"], 8);
    assert_eq!(json["input"][0]["dims"], serde_json::json!([3, 224, 224]));
    assert_eq!(json["input"][0]["optional"], false);
    assert_eq!(json["output"][0]["label_filename"], "");
    assert_eq!(json["instance_group"][0]["kind"], "KIND_CPU");
    assert_eq!(
        json["sequence_batching"]["max_sequence_idle_microseconds"],
        5000
    );
    // and it reads back to the same config
    let back = config_from_json(&json.to_string()).unwrap();
    assert_eq!(back.input, cfg.input);
    assert_eq!(back.max_batch_size, 8);
}

fn io() -> ModelIo {
    ModelIo {
        inputs: vec![IoSpec {
            name: "x".into(),
            datatype: Some(DataType::Fp32),
            shape: vec![-1, 3, 48, 192],
        }],
        outputs: vec![IoSpec {
            name: "y".into(),
            datatype: Some(DataType::Fp32),
            shape: vec![-1, 2],
        }],
        max_batch_size: None,
    }
}

#[test]
fn autocomplete_takes_a_declared_max_batch_size() {
    let mut cfg = parse_pbtxt("plugin", "").unwrap();
    autocomplete(
        &mut cfg,
        &ModelIo {
            max_batch_size: Some(16),
            ..io()
        },
    );
    assert_eq!(cfg.max_batch_size, 16);
    assert!(cfg.dynamic_batching.is_none(), "declared, not defaulted");
    assert_eq!(cfg.input[0].dims, vec![3, 48, 192]);
    let mut set = parse_pbtxt("plugin", "max_batch_size: 2").unwrap();
    autocomplete(
        &mut set,
        &ModelIo {
            max_batch_size: Some(16),
            ..io()
        },
    );
    assert_eq!(set.max_batch_size, 2, "the config's own value wins");
}

#[test]
fn autocomplete_fills_everything_from_the_model() {
    let mut cfg = parse_pbtxt("cls", "").unwrap();
    autocomplete(&mut cfg, &io());
    assert_eq!(cfg.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
    assert!(
        cfg.dynamic_batching.is_some(),
        "a defaulted max_batch_size turns batching on"
    );
    assert_eq!(cfg.input[0].dims, vec![3, 48, 192]);
    assert_eq!(cfg.input[0].data_type, Some(DataType::Fp32));
    assert_eq!(cfg.output[0].dims, vec![2]);
}

#[test]
fn autocomplete_respects_explicit_max_batch_size_zero() {
    let text = "max_batch_size: 0";
    let mut cfg = parse_pbtxt("cls", text).unwrap();
    assert!(cfg.max_batch_size_set);
    autocomplete(&mut cfg, &io());
    assert_eq!(cfg.max_batch_size, 0);
    assert_eq!(cfg.input[0].dims, vec![-1, 3, 48, 192]);
    // The same from JSON (a load request's config), where the key is present with 0.
    let mut cfg = config_from_json(r#"{"name": "cls", "max_batch_size": 0}"#).unwrap();
    assert!(cfg.max_batch_size_set);
    autocomplete(&mut cfg, &io());
    assert_eq!(cfg.max_batch_size, 0);
    let cfg = config_from_json(r#"{"name": "cls"}"#).unwrap();
    assert!(!cfg.max_batch_size_set);
}

#[test]
fn autocomplete_fills_partial_inputs_only() {
    let text = "max_batch_size: 2\ninput [ { name: \"x\" } ]\noutput [ { name: \"y\" label_filename: \"l.txt\" } ]";
    let mut cfg = parse_pbtxt("cls", text).unwrap();
    autocomplete(&mut cfg, &io());
    assert_eq!(cfg.input[0].dims, vec![3, 48, 192]);
    assert_eq!(cfg.output[0].label_filename, "l.txt");
    assert_eq!(cfg.output[0].data_type, Some(DataType::Fp32));
}

#[test]
fn fixed_first_dim_does_not_batch() {
    let mut io = io();
    io.inputs[0].shape[0] = 1;
    let mut cfg = parse_pbtxt("cls", "").unwrap();
    autocomplete(&mut cfg, &io);
    assert_eq!(cfg.max_batch_size, 0);
    assert_eq!(cfg.input[0].dims, vec![1, 3, 48, 192]);
}

#[test]
fn normalize_sets_triton_defaults() {
    let mut cfg = parse_pbtxt("m", "platform: \"onnxruntime_onnx\"").unwrap();
    normalize(&mut cfg, "m", Path::new("/nonexistent"));
    assert_eq!(cfg.name, "m");
    assert_eq!(cfg.backend, ONNX_BACKEND);
    assert_eq!(
        cfg.version_policy
            .as_ref()
            .unwrap()
            .latest
            .as_ref()
            .unwrap()
            .num_versions,
        1
    );
    assert_eq!(cfg.instance_group[0].kind, InstanceKind::Cpu);
    assert_eq!(cfg.instance_group[0].count, 2);
    assert_eq!(cfg.default_model_filename, "model.onnx");
}

#[test]
fn data_types_and_formats_are_typed_and_echo_their_config_names() {
    let text = r#"input [ { name: "s" data_type: TYPE_STRING dims: [ 1 ] format: FORMAT_NHWC },
                          { name: "u" dims: [ 1 ] } ]
                  output [ { name: "y" data_type: TYPE_BF16 dims: [ 2 ] } ]"#;
    let cfg = parse_pbtxt("m", text).unwrap();
    assert_eq!(cfg.input[0].data_type, Some(DataType::Bytes));
    assert_eq!(cfg.input[0].format, TensorFormat::Nhwc);
    assert_eq!(cfg.input[1].data_type, None, "unset is TYPE_INVALID");
    assert_eq!(cfg.input[1].format, TensorFormat::None);
    assert_eq!(cfg.output[0].data_type, Some(DataType::Bf16));
    let json = config_to_json(&cfg);
    assert_eq!(json["input"][0]["data_type"], "TYPE_STRING");
    assert_eq!(json["input"][0]["format"], "FORMAT_NHWC");
    assert_eq!(json["input"][1]["data_type"], "TYPE_INVALID");
    assert_eq!(json["output"][0]["data_type"], "TYPE_BF16");
    // The JSON form reads back to the same config.
    let back = config_from_json(&json.to_string()).unwrap();
    assert_eq!(back.input, cfg.input);
    assert_eq!(back.output, cfg.output);
}

#[test]
fn a_validated_spec_carries_a_typed_signature() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"platform: "onnxruntime_onnx" max_batch_size: 4
                  input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ]
                            reshape: { shape: [ 2, -1 ] } },
                          { name: "s" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
                  output [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] } ]"#;
    let mut cfg = parse_pbtxt("m", text).unwrap();
    normalize(&mut cfg, "m", dir.path());
    let spec = validate(cfg, "m", dir.path()).unwrap();
    let sig = &spec.signature;
    assert_eq!(sig.model, "m");
    assert_eq!(sig.max_batch_size, 4);
    assert!(sig.batches());
    let x = sig.input("x").unwrap();
    assert_eq!(
        (x.datatype, &x.dims[..], x.reshape.as_deref(), x.optional),
        (DataType::Fp32, &[-1, 2][..], Some(&[2, -1][..]), false)
    );
    assert_eq!(
        sig.input("s").map(|s| (s.datatype, s.optional)),
        Some((DataType::Bytes, true))
    );
    assert_eq!(sig.output("y").map(|y| y.datatype), Some(DataType::Int64));
    assert_eq!(
        (sig.input_names(), sig.output_names()),
        ("x, s".into(), "y".into())
    );
    assert!(sig.input("y").is_none() && sig.output("x").is_none());

    // Built outside `validate`, an unset datatype is refused, naming the field.
    let mut cfg = parse_pbtxt("m", r#"input [ { name: "u" dims: [ 1 ] } ]"#).unwrap();
    let e = Signature::of(&cfg).unwrap_err();
    assert_eq!(e.path, "input[0] 'u'.data_type");
    cfg.input.clear();
    cfg.max_batch_size = -1;
    assert_eq!(Signature::of(&cfg).unwrap_err().path, "max_batch_size");
}

#[test]
fn only_a_wasm_plugin_without_a_response_cache_can_be_decoupled() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let mut cfg = parse_pbtxt("m", text).unwrap();
        normalize(&mut cfg, "m", dir.path());
        validate(cfg, "m", dir.path())
    };
    let io = r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
                output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]"#;
    let plugin = format!(r#"backend: "wasm" model_transaction_policy {{ decoupled: true }} {io}"#);
    let spec = check(&plugin).unwrap();
    assert!(spec.config.decoupled());
    assert!(!check(&format!(r#"backend: "wasm" {io}"#))
        .unwrap()
        .config
        .decoupled());

    let onnx = format!(
        r#"platform: "onnxruntime_onnx" model_transaction_policy {{ decoupled: true }} {io}"#
    );
    let e = check(&onnx).unwrap_err().to_string();
    assert!(
        e.contains("model_transaction_policy") && e.contains("only wasm plugins"),
        "{e}"
    );
    let cached = format!("{plugin} response_cache {{ enable: true }}");
    let e = check(&cached).unwrap_err().to_string();
    assert!(
        e.contains("response_cache") && e.contains("decoupled"),
        "{e}"
    );
}
