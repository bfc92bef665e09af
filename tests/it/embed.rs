//! The in-process library API (`wisp_server::embed`): the same models and service layer as the
//! server, with no sockets.

use wisp_core::{DataType, ErrorKind, InferRequest, Tensor};
use wisp_server::settings::{ControlMode, OnnxEngine, Settings};
use wisp_tests::fixture_repo;

fn settings(repo: &std::path::Path) -> Settings {
    let mut s = Settings::for_repository(repo);
    s.onnx_engine = OnnxEngine::Tract;
    s
}

fn add_sub_inputs(a: f32, b: f32) -> Vec<Tensor> {
    vec![
        Tensor::from_values("INPUT0", vec![1, 16], &[a; 16]).unwrap(),
        Tensor::from_values("INPUT1", vec![1, 16], &[b; 16]).unwrap(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infers_in_process_with_the_servers_validation_and_statistics() {
    let wisp = wisp_server::embed::open(settings(&fixture_repo()))
        .await
        .unwrap();
    assert!(wisp.model_ready("add_sub", None));
    assert!(wisp
        .models()
        .unwrap()
        .iter()
        .any(|e| e.name == "add_sub" && e.state == "READY"));
    let meta = wisp.metadata("add_sub", None).unwrap();
    assert_eq!(meta.inputs[0].name, "INPUT0");
    assert_eq!(meta.inputs[0].shape, vec![-1, 16]);

    let out = wisp
        .infer("add_sub", None, add_sub_inputs(5.0, 2.0))
        .await
        .unwrap();
    let names: Vec<&str> = out.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["OUTPUT0", "OUTPUT1"], "every output, config order");
    assert_eq!(out[0].values::<f32>().unwrap(), vec![7.0; 16]);
    assert_eq!(out[1].values::<f32>().unwrap(), vec![3.0; 16]);

    // Requested outputs, in the order asked; a pinned version.
    let req = InferRequest {
        inputs: add_sub_inputs(1.0, 1.0),
        requested_outputs: vec!["OUTPUT1".into()],
        ..Default::default()
    };
    let out = wisp.infer_request("add_sub", Some("1"), req).await.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].name, "OUTPUT1");
    assert_eq!(out[0].values::<f32>().unwrap(), vec![0.0; 16]);

    // Concurrent callers, each with its own answer.
    let wisp = std::sync::Arc::new(wisp);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..32 {
        let wisp = wisp.clone();
        calls.spawn(async move {
            let out = wisp
                .infer("add_sub", None, add_sub_inputs(i as f32, 1.0))
                .await
                .unwrap();
            assert_eq!(out[0].values::<f32>().unwrap(), vec![i as f32 + 1.0; 16]);
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }

    // The server's errors, with the server's words.
    let e = wisp
        .infer("no_such_model", None, add_sub_inputs(1.0, 1.0))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let wrong = vec![
        Tensor::from_values("INPUT0", vec![1, 16], &[1i64; 16]).unwrap(),
        Tensor::from_values("INPUT1", vec![1, 16], &[1.0f32; 16]).unwrap(),
    ];
    let e = wisp.infer("add_sub", None, wrong).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArg);
    assert!(
        e.message()
            .contains("inference input 'INPUT0' data-type is 'INT64'"),
        "{e}"
    );
    let stats = wisp
        .service()
        .statistics(Some("add_sub"), None)
        .unwrap()
        .remove(0);
    assert_eq!(stats.inference_count, 34);
    assert_eq!(stats.success.count, 34);
    assert_eq!(
        stats.fail.count, 1,
        "the invalid request counts as a failure"
    );

    let wisp = std::sync::Arc::try_unwrap(wisp).ok().expect("one owner");
    wisp.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_and_unloads_in_explicit_mode_only() {
    let repo = tempfile::tempdir().unwrap();
    wisp_tests::copy_dir(
        &fixture_repo().join("add_sub"),
        &repo.path().join("add_sub"),
    )
    .unwrap();

    let wisp = wisp_server::embed::open(settings(repo.path()))
        .await
        .unwrap();
    let e = wisp.unload("add_sub").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(
        e.message()
            .contains("explicit model load / unload is not allowed"),
        "{e}"
    );
    wisp.shutdown().await.unwrap();

    let mut s = settings(repo.path());
    s.model_control_mode = ControlMode::Explicit;
    let wisp = wisp_server::embed::open(s).await.unwrap();
    assert!(
        !wisp.model_ready("add_sub", None),
        "explicit mode starts empty"
    );
    wisp.load("add_sub").await.unwrap();
    let out = wisp
        .infer("add_sub", None, add_sub_inputs(2.0, 2.0))
        .await
        .unwrap();
    assert_eq!(out[0].values::<f32>().unwrap(), vec![4.0; 16]);

    // A config given in place of config.pbtxt.
    let config = r#"{"name": "add_sub", "platform": "onnxruntime_onnx", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}"#;
    wisp.load_with_config("add_sub", config).await.unwrap();
    let out = wisp
        .infer("add_sub", None, add_sub_inputs(2.0, 2.0))
        .await
        .unwrap();
    assert_eq!(out.len(), 1, "the given config declares one output");
    assert_eq!(out[0].datatype, DataType::Fp32);

    wisp.unload("add_sub").await.unwrap();
    assert!(!wisp.model_ready("add_sub", None));
    let e = wisp
        .infer("add_sub", None, add_sub_inputs(2.0, 2.0))
        .await
        .unwrap_err();
    assert_ne!(e.kind(), ErrorKind::Internal, "{e}");
    wisp.shutdown().await.unwrap();
}
