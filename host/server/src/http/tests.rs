//! The HTTP routes' error table, in-process: the router called directly (no socket) over a
//! service on the fixture repository (tract, so no ONNX Runtime is needed).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{json, Value};

use super::*;
use crate::embed::Embedded;
use crate::settings::{OnnxEngine, Settings};

fn fixture_repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/repo")
}

async fn open() -> (Embedded, axum::Router) {
    open_restricted(Default::default()).await
}

async fn open_restricted(restricted: crate::restricted::Restrictions) -> (Embedded, axum::Router) {
    let mut settings = Settings::for_repository(fixture_repo());
    settings.onnx_engine = OnnxEngine::Tract;
    let wisp = crate::embed::open(settings)
        .await
        .expect("the fixture repository opens");
    let state = Arc::new(AppState {
        service: wisp.service().clone(),
        max_input_size: 1 << 20,
        body_timeout: Duration::from_secs(5),
        restricted,
    });
    (wisp, router(state))
}

/// One request through the router: its status, `Allow` header and body as JSON (`Null` when
/// the body is not JSON).
async fn call(
    app: &axum::Router,
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, Option<String>, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let mut app = app.clone();
    let resp = tower_service::Service::call(&mut app, req).await.unwrap();
    let status = resp.status();
    let allow = resp
        .headers()
        .get(header::ALLOW)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        allow,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn add_sub_body(n: usize) -> String {
    json!({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, n], "data": vec![1.0f32; n]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, n], "data": vec![2.0f32; n]},
    ]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_its_errors_with_tritons_status_and_a_message() {
    let (wisp, app) = open().await;
    let sixteen: Vec<f32> = vec![1.0; 16];
    let generate = json!({"INPUT0": sixteen, "INPUT1": sixteen}).to_string();
    // (method, path, body, status, a fragment of the error message; "" for a success)
    let cases: Vec<(Method, &str, String, StatusCode, &str)> = vec![
        (
            Method::GET,
            "/v2/health/live",
            String::new(),
            StatusCode::OK,
            "",
        ),
        (
            Method::GET,
            "/v2/health/ready",
            String::new(),
            StatusCode::OK,
            "",
        ),
        (
            Method::GET,
            "/v2/models/add_sub",
            String::new(),
            StatusCode::OK,
            "",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/infer",
            add_sub_body(16),
            StatusCode::OK,
            "",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/generate",
            generate.clone(),
            StatusCode::OK,
            "",
        ),
        (
            Method::GET,
            "/v2/models/nope",
            String::new(),
            StatusCode::NOT_FOUND,
            "Request for unknown model: 'nope' is not found",
        ),
        (
            Method::GET,
            "/v2/models/add_sub/versions/9/config",
            String::new(),
            StatusCode::NOT_FOUND,
            "version 9 is not found",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/infer",
            "{not json".into(),
            StatusCode::BAD_REQUEST,
            "",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/infer",
            add_sub_body(15),
            StatusCode::BAD_REQUEST,
            "INPUT0",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/generate",
            r#"{"INPUT0": [1, 2]}"#.into(),
            StatusCode::BAD_REQUEST,
            "input 'INPUT0'",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/generate_stream",
            r#"{"x": [[]]}"#.into(),
            StatusCode::BAD_REQUEST,
            "'x'",
        ),
        (
            Method::POST,
            "/v2/models/add_sub/frobnicate",
            String::new(),
            StatusCode::NOT_FOUND,
            "unknown model action 'frobnicate'",
        ),
        (
            Method::GET,
            "/v2/no/such/route",
            String::new(),
            StatusCode::NOT_FOUND,
            "no route for GET",
        ),
        (
            Method::GET,
            "/v2/cudasharedmemory/status",
            String::new(),
            StatusCode::NOT_IMPLEMENTED,
            "",
        ),
        (
            Method::POST,
            "/v2/repository/index",
            r#"{"ready": "yes"}"#.into(),
            StatusCode::BAD_REQUEST,
            "Invalid value for 'ready': expected a boolean",
        ),
        // Triton's QA (test_repository_index_deeply_nested_json): 250 000 nested arrays
        (
            Method::POST,
            "/v2/repository/index",
            format!(
                r#"{{"ready":{}true{}}}"#,
                "[".repeat(250_000),
                "]".repeat(250_000)
            ),
            StatusCode::BAD_REQUEST,
            "Invalid value for 'ready': expected a boolean",
        ),
        (
            Method::POST,
            "/v2/repository/index",
            r#"{"other": [[[[{"deep": 1}]]]], "ready": false}"#.into(),
            StatusCode::OK,
            "",
        ),
        (
            Method::POST,
            "/v2/repository/index",
            r#"[true]"#.into(),
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        ),
        (
            Method::POST,
            "/v2/repository/models/add_sub/unload",
            String::new(),
            StatusCode::SERVICE_UNAVAILABLE,
            "explicit model load / unload is not allowed if polling is enabled",
        ),
    ];
    for (method, path, body, status, message) in cases {
        let (got, _, json) = call(&app, method.clone(), path, &body).await;
        assert_eq!(got, status, "{method} {path}: {json}");
        if status.is_success() {
            continue;
        }
        let error = json["error"].as_str().unwrap_or_default();
        assert!(
            !error.is_empty(),
            "{method} {path}: no error message: {json}"
        );
        assert!(error.contains(message), "{method} {path}: {error}");
    }
    wisp.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_405_with_the_allowed_one() {
    let (wisp, app) = open().await;
    for (method, path, allow) in [
        (Method::PUT, "/v2/models/add_sub/infer", "POST"),
        (Method::GET, "/v2/models/add_sub/generate", "POST"),
        (Method::GET, "/v2/models/add_sub/generate_stream", "POST"),
        (Method::POST, "/v2/models/add_sub/ready", "GET"),
        (Method::DELETE, "/v2/models/add_sub/config", "GET"),
        // Every route answers a wrong method 405, as each of Triton's handlers does.
        (Method::POST, "/v2", "GET"),
        (Method::POST, "/v2/health/live", "GET"),
        (Method::DELETE, "/v2/health/ready", "GET"),
        (Method::POST, "/v2/models/stats", "GET"),
        (Method::GET, "/v2/repository/index", "POST"),
        (Method::GET, "/v2/repository/models/add_sub/load", "POST"),
        (Method::PUT, "/v2/logging", "GET, POST"),
        (Method::DELETE, "/v2/trace/setting", "GET, POST"),
        (Method::POST, "/v2/systemsharedmemory/status", "GET"),
        (
            Method::GET,
            "/v2/systemsharedmemory/region/r/register",
            "POST",
        ),
        (Method::PUT, "/v2/cudasharedmemory/status", "GET, POST"),
    ] {
        let (status, got, _) = call(&app, method.clone(), path, "").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(got.as_deref(), Some(allow), "{method} {path}");
    }
    wisp.shutdown().await.unwrap();
}

/// Triton's order: a restricted group's header is checked before the method; a path that is no
/// route is 404 whatever is restricted, in OpenAI's shape under `/v1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_is_checked_before_the_method_and_no_route_is_404() {
    let restricted = crate::restricted::Restrictions::parse(
        &["health,inference:k=v".to_string()],
        "--http-restricted-api",
        "",
    )
    .unwrap();
    let (wisp, app) = open_restricted(restricted).await;
    let (status, _, json) = call(&app, Method::POST, "/v2/health/live", "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_eq!(
        json["error"],
        "This API is restricted, expecting header 'k'"
    );
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v2/health/live")
        .header("k", "v")
        .body(Body::empty())
        .unwrap();
    let resp = tower_service::Service::call(&mut app.clone(), req)
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    for (path, message) in [
        ("/v2/health/other", "no route for GET /v2/health/other"),
        (
            "/v2/models/add_sub/frobnicate",
            "unknown model action 'frobnicate'",
        ),
    ] {
        let (status, _, json) = call(&app, Method::GET, path, "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {json}");
        assert_eq!(json["error"], message, "{path}");
    }
    let (status, _, json) = call(&app, Method::POST, "/v1/chat/completions", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    assert_eq!(json["error"]["code"], "unknown_url", "{json}");
    wisp.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_answers_an_ordinary_model_with_its_outputs_by_name() {
    let (wisp, app) = open().await;
    let body = json!({"INPUT0": vec![3.0f32; 16], "INPUT1": vec![1.0f32; 16]}).to_string();
    let (status, _, json) = call(&app, Method::POST, "/v2/models/add_sub/generate", &body).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["model_name"], "add_sub");
    assert_eq!(json["OUTPUT0"], json!(vec![4.0f32; 16]));
    assert_eq!(json["OUTPUT1"], json!(vec![2.0f32; 16]));
    wisp.shutdown().await.unwrap();
}
