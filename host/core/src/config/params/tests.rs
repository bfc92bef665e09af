use super::*;

fn cfg(params: &[(&str, &str)]) -> ModelConfig {
    let mut c = ModelConfig {
        name: "p".into(),
        ..Default::default()
    };
    params.iter().for_each(|(k, v)| c.set_parameter(k, v));
    c
}

#[test]
fn other_models_get_no_sandbox_but_an_escaping_read_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = |read_dir| {
        let mut errs = Vec::new();
        let p = read(
            &cfg(&[(READ_DIR_KEY, read_dir)]),
            dir.path(),
            false,
            &mut errs,
        );
        (p.sandbox, errs)
    };
    assert_eq!(onnx("missing"), (None, vec![]));
    for escaping in ["/", "../up"] {
        let (sandbox, errs) = onnx(escaping);
        assert!(sandbox.is_none());
        let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, [format!("parameters.{READ_DIR_KEY}")], "{errs:?}");
    }
}

#[test]
fn a_sandbox_denies_everything_by_default() {
    let s = Sandbox::of(&cfg(&[]), Path::new(".")).unwrap();
    assert_eq!(s, Sandbox::default());
    assert!(s.allow_env.is_empty() && !s.clock && s.read_dir.is_none() && s.fuel.is_none());
    assert!(
        s.on_caller,
        "not a grant: where a call runs, not what it may reach"
    );
}

#[test]
fn a_sandbox_reads_grants_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("assets")).unwrap();
    let s = Sandbox::of(
        &cfg(&[
            (MEMORY_LIMIT_KEY, "16"),
            (TIMEOUT_KEY, "250"),
            (FUEL_KEY, "1000"),
            (ENV_KEY, "A_VAR, B_VAR,,"),
            (CLOCK_KEY, "true"),
            (READ_DIR_KEY, "assets"),
            (ON_CALLER_KEY, "false"),
        ]),
        dir.path(),
    )
    .unwrap();
    assert!(!s.on_caller);
    assert_eq!(s.memory_bytes, 16 << 20);
    assert_eq!(s.timeout, Duration::from_millis(250));
    assert_eq!(s.fuel, Some(1000));
    assert_eq!(s.allow_env, ["A_VAR", "B_VAR"]);
    assert!(s.clock);
    assert_eq!(s.read_dir, Some(dir.path().join("assets")));
    let unmetered = Sandbox::of(&cfg(&[(FUEL_KEY, "0")]), dir.path()).unwrap();
    assert_eq!(unmetered.fuel, None);
}

#[test]
fn bad_sandbox_values_name_the_key() {
    for (k, v) in [
        (MEMORY_LIMIT_KEY, "0"),
        (MEMORY_LIMIT_KEY, "99999"),
        (TIMEOUT_KEY, "soon"),
        (TIMEOUT_KEY, "0"),
        (FUEL_KEY, "-1"),
        (CLOCK_KEY, "yes"),
        (ON_CALLER_KEY, "1"),
        (READ_DIR_KEY, "missing"),
        (READ_DIR_KEY, "/"),
        (READ_DIR_KEY, ".."),
    ] {
        let e = Sandbox::of(&cfg(&[(k, v)]), Path::new(".")).unwrap_err();
        assert_eq!(e.path, format!("parameters.{k}"), "{k}={v}: {}", e.message);
    }
}

#[test]
fn a_model_may_name_its_onnx_engine() {
    assert_eq!(OnnxOptions::of(&cfg(&[])).unwrap().engine, None);
    for (v, want) in [
        ("tract", EngineRequest::Tract),
        (" onnxruntime ", EngineRequest::OnnxRuntime),
    ] {
        let o = OnnxOptions::of(&cfg(&[(ENGINE_KEY, v)])).unwrap();
        assert_eq!(o.engine, Some(want), "{v}");
    }
    let e = OnnxOptions::of(&cfg(&[(ENGINE_KEY, "openvino")])).unwrap_err();
    assert_eq!(e.path, "parameters.onnx.engine");
    assert!(
        e.message.contains("'tract' or 'onnxruntime'"),
        "{}",
        e.message
    );
}

#[test]
fn onnx_thread_counts_are_bounded() {
    assert_eq!(OnnxOptions::of(&cfg(&[])).unwrap(), OnnxOptions::default());
    let t = OnnxOptions::of(&cfg(&[(INTRA_OP_KEY, "2"), (INTER_OP_KEY, " 0 ")])).unwrap();
    assert_eq!((t.intra_op, t.inter_op), (Some(2), Some(0)));
    for (k, v) in [
        (INTRA_OP_KEY, "257"),
        (INTER_OP_KEY, "x"),
        (INTRA_OP_KEY, "-1"),
    ] {
        let e = OnnxOptions::of(&cfg(&[(k, v)])).unwrap_err();
        assert_eq!(e.path, format!("parameters.{k}"), "{k}={v}: {e:?}");
    }
}

#[test]
fn sla_parameters_are_bounded_and_named() {
    assert_eq!(Sla::of(&cfg(&[])).unwrap(), None);
    let s = Sla::of(&cfg(&[(P99_KEY, "25"), (WINDOW_KEY, "5")]))
        .unwrap()
        .unwrap();
    assert_eq!(s.p99, Some(Duration::from_millis(25)));
    assert_eq!(s.window, Duration::from_secs(5));
    assert_eq!(s.min_requests, DEFAULT_MIN_REQUESTS);
    for (k, v) in [
        (P99_KEY, "0"),
        (P99_KEY, "-1"),
        (P99_KEY, "NaN"),
        (P99_KEY, "1e300"),
        (ERROR_RATE_KEY, "1"),
        (ERROR_RATE_KEY, "-0.1"),
        (WINDOW_KEY, "0"),
        (WINDOW_KEY, "99999999999"),
        (MIN_REQUESTS_KEY, "0"),
    ] {
        let mut params = vec![(k, v)];
        if k != P99_KEY {
            params.push((P99_KEY, "10"));
        }
        let err = Sla::of(&cfg(&params)).unwrap_err();
        assert_eq!(err.path, format!("parameters.{k}"), "{k}={v}: {err:?}");
    }
    let err = Sla::of(&cfg(&[(WINDOW_KEY, "5")])).unwrap_err();
    assert!(err.message.contains("needs"), "{err:?}");
}

fn embedder(extra: &[(&str, &str)]) -> ModelConfig {
    let text = r#"
        name: "e"
        backend: "wasm"
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] },
                 { name: "TOKENS" data_type: TYPE_INT64 dims: [ 1 ] } ]"#;
    let mut c = crate::config::parse_pbtxt("e", text).unwrap();
    c.parameters = cfg(extra).parameters;
    c
}

#[test]
fn models_join_the_embeddings_api_only_when_asked() {
    assert_eq!(EmbeddingApi::of(&embedder(&[])).unwrap(), None);
    let api = EmbeddingApi::of(&embedder(&[("openai.api", "embeddings")]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (api.input.as_str(), api.output.as_str()),
        ("TEXT", "EMBEDDING")
    );
    assert_eq!(
        (api.size, api.usage, api.dimensions),
        (4, None, Dimensions::Fixed)
    );
    assert_eq!(api.max_inputs, MAX_EMBEDDING_INPUTS);
}

#[test]
fn embeddings_parameters_are_checked_against_the_signature() {
    let with = |pairs: &[(&str, &str)]| {
        let mut all = vec![("openai.api", "embeddings")];
        all.extend_from_slice(pairs);
        EmbeddingApi::of(&embedder(&all))
    };
    let api = with(&[
        ("openai.usage", "TOKENS"),
        ("openai.dimensions", "truncate"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(api.usage.as_deref(), Some("TOKENS"));
    assert_eq!(api.dimensions, Dimensions::Truncate);
    for (pair, named) in [
        (("openai.output", "TOKENS"), "openai.output"),
        (("openai.output", "NOPE"), "openai.output"),
        (("openai.usage", "EMBEDDING"), "openai.usage"),
        (("openai.input", "EMBEDDING"), "openai.input"),
        (("openai.dimensions", "any"), "openai.dimensions"),
        (("openai.max_inputs", "0"), "openai.max_inputs"),
        (("openai.max_inputs", "5000"), "openai.max_inputs"),
    ] {
        let e = with(&[pair]).unwrap_err();
        assert_eq!(e.path, format!("parameters.{named}"), "{pair:?}: {e:?}");
    }
    let e = EmbeddingApi::of(&embedder(&[("openai.api", "chat")])).unwrap_err();
    assert_eq!(e.path, "parameters.openai.api");
}

#[test]
fn a_spec_carries_its_parameters_typed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = embedder(&[
        ("openai.api", "embeddings"),
        (P99_KEY, "50"),
        (FUEL_KEY, "7"),
    ]);
    crate::config::normalize(&mut c, "e", dir.path());
    let spec = crate::config::validate(c, "e", dir.path()).unwrap();
    assert_eq!(spec.params.sandbox.as_ref().unwrap().fuel, Some(7));
    assert_eq!(spec.params.embeddings.as_ref().unwrap().size, 4);
    assert_eq!(
        spec.params.sla.as_ref().unwrap().p99,
        Some(Duration::from_millis(50))
    );
}

#[test]
fn a_load_request_may_keep_a_plugin_off_callers_threads_but_not_put_it_back() {
    let dir = Path::new(".");
    let off = cfg(&[(ON_CALLER_KEY, "false")]);
    let on = cfg(&[]);
    let sandbox = |c: &ModelConfig| Sandbox::of(c, dir).unwrap();
    assert!(check_override_narrows(&on, &off, &sandbox(&off), dir).is_ok());
    let e = check_override_narrows(&off, &on, &sandbox(&on), dir).unwrap_err();
    assert!(e.message().contains(ON_CALLER_KEY), "{}", e.message());
}

fn warmed(params: &[(&str, &str)]) -> ModelConfig {
    let mut c = cfg(params);
    c.model_warmup.push(crate::config::ModelWarmup {
        name: "held-out".into(),
        ..Default::default()
    });
    c
}

#[test]
fn a_gate_is_read_with_its_bounds_and_defaults() {
    assert_eq!(Gate::of(&warmed(&[])).unwrap(), None);
    let g = Gate::of(&warmed(&[
        (MIN_COSINE_KEY, "0.99"),
        (MAX_LATENCY_RATIO_KEY, "1.2"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(g.min_cosine, Some(0.99));
    assert_eq!(g.max_latency_ratio, Some(1.2));
    assert_eq!((g.min_top1, g.max_abs_diff, g.baseline), (None, None, None));
    assert_eq!(g.rounds, 5);
    let g = Gate::of(&warmed(&[
        (MIN_TOP1_KEY, "1"),
        (MAX_ABS_DIFF_KEY, "0"),
        (BASELINE_KEY, "3"),
        (ROUNDS_KEY, "100"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (g.min_top1, g.max_abs_diff, g.baseline, g.rounds),
        (Some(1.0), Some(0.0), Some(3), 100)
    );
}

#[test]
fn a_gate_value_out_of_bounds_is_refused_naming_its_key() {
    for (key, value) in [
        (MIN_COSINE_KEY, "1.01"),
        (MIN_COSINE_KEY, "NaN"),
        (MIN_TOP1_KEY, "-0.1"),
        (MAX_ABS_DIFF_KEY, "inf"),
        (MAX_ABS_DIFF_KEY, "-1"),
        (MAX_LATENCY_RATIO_KEY, "0"),
        (MAX_LATENCY_RATIO_KEY, "1e9"),
        (BASELINE_KEY, "0"),
        (BASELINE_KEY, "9223372036854775808"),
        (ROUNDS_KEY, "0"),
        (ROUNDS_KEY, "101"),
    ] {
        let e = Gate::of(&warmed(&[(MIN_COSINE_KEY, "0.9"), (key, value)])).unwrap_err();
        assert_eq!(e.path, format!("parameters.{key}"), "{key}={value}");
        assert!(e.message.contains(value), "{e:?}");
    }
    // A baseline or rounds without a bound to judge is a mistake, not a gate.
    let e = Gate::of(&warmed(&[(ROUNDS_KEY, "3")])).unwrap_err();
    assert_eq!(e.path, format!("parameters.{ROUNDS_KEY}"));
}

#[test]
fn a_gate_needs_held_out_inputs_and_one_response_per_request() {
    let e = Gate::of(&cfg(&[(MIN_TOP1_KEY, "0.9")])).unwrap_err();
    assert_eq!(e.path, format!("parameters.{MIN_TOP1_KEY}"));
    assert!(e.message.contains("model_warmup"), "{e:?}");
    let mut decoupled = warmed(&[(MIN_TOP1_KEY, "0.9")]);
    decoupled.other.insert(
        crate::config::TRANSACTION_POLICY.into(),
        serde_json::json!({ "decoupled": true }),
    );
    assert!(Gate::of(&decoupled)
        .unwrap_err()
        .message
        .contains("decoupled"));
    let mut stateful = warmed(&[(MIN_TOP1_KEY, "0.9")]);
    stateful
        .other
        .insert(crate::config::sequence::FIELD.into(), serde_json::json!({}));
    assert!(Gate::of(&stateful)
        .unwrap_err()
        .message
        .contains("stateful"));
}
