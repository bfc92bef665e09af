//! The HTTP/REST front end: every KServe v2 route this server supports, dispatched from the
//! path as Triton's `http_server.cc` does (model names may hold any character but `/`).
//!
//! Request flow for `POST /v2/models/{m}[/versions/{v}]/infer`: read the body (bounded by
//! `--http-max-input-size`, gzip/deflate decoded), resolve the model version, decode and
//! validate ([`codec::decode`]), await the scheduler, encode ([`codec::encode`]).

pub mod codec;
pub mod error;

use std::io::Read;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use wisp_core::config::config_to_json;
use wisp_core::{DataType, Error};

use crate::cache::ResponseCache;
use crate::metrics::Metrics;
use crate::registry::{ModelEntry, ModelVersion, Registry, VersionState};
use error::ApiError;
use wisp_scheduler::{DurationStat, FailReason};

/// The header carrying the JSON length when binary tensor data follows it.
pub const HEADER_LEN: &str = "inference-header-content-length";

/// Extensions this server implements (reported by `GET /v2`).
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "parameters",
    "schedule_policy",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
];

/// Shared state of the HTTP front end.
pub struct AppState {
    /// Loaded models.
    pub registry: Arc<Registry>,
    /// Largest accepted body (after decompression).
    pub max_input_size: usize,
    /// How long a client has to send a whole body (`--http-body-timeout-secs`).
    pub body_timeout: std::time::Duration,
    /// The in-flight decode budget, in KiB (`--max-inflight-bytes`): every infer request holds
    /// an estimate of its decoding memory from its body until its response is built.
    pub budget: Arc<tokio::sync::Semaphore>,
    /// Ready only if every model is ready.
    pub strict_readiness: bool,
    /// The response cache (`--cache-config`), if any.
    pub cache: Option<Arc<ResponseCache>>,
    /// Model control mode (load/unload allowed only in explicit mode).
    pub control_mode: crate::settings::ControlMode,
    /// Logging settings (logging extension).
    pub logging: crate::logging::LogControl,
    /// Requests of one gRPC `ModelStreamInfer` stream in flight at once
    /// (`--grpc-stream-max-in-flight`).
    pub grpc_stream_in_flight: usize,
    /// API groups gated behind a header (`--http-restricted-api`).
    pub restricted: crate::restricted::Restrictions,
}

type ApiResult = Result<Response, ApiError>;

/// The router: one fallback handler that dispatches on the path.
pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new().fallback(dispatch).with_state(state)
}

async fn dispatch(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let method = req.method().clone();
    if let Some(group) = crate::restricted::ApiGroup::of_http(&segs) {
        let headers = req.headers();
        if let Err(header) = app
            .restricted
            .check(group, |h| headers.get(h).map(|v| v.as_bytes()))
        {
            let body =
                json!({ "error": format!("This API is restricted, expecting header '{header}'") });
            return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
        }
    }
    let result = match (segs.as_slice(), &method) {
        (["v2"], &Method::GET) => Ok(server_metadata()),
        (["v2", "health", "live"], &Method::GET) => Ok(StatusCode::OK.into_response()),
        (["v2", "health", "ready"], &Method::GET) => Ok(server_ready(&app)),
        (["v2", "models", "stats"], &Method::GET) => Ok(stats(&app, None, None)),
        (["v2", "repository", rest @ ..], &Method::POST) => repository(&app, rest, req).await,
        (["v2", "logging"], &Method::GET) => Ok(json_response(app.logging.get().to_json())),
        (["v2", "logging"], &Method::POST) => logging_update(&app, req).await,
        (["v2", "models", rest @ ..], _) if !rest.is_empty() => {
            model_route(&app, rest, &method, req).await
        }
        _ => Err(ApiError(Error::not_found(format!(
            "no route for {method} {path}"
        )))),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn model_route(app: &AppState, rest: &[&str], method: &Method, req: Request) -> ApiResult {
    // {m} | {m}/versions/{v} , then optional action
    let (model, version, action) = match rest {
        [m] => (*m, None, None),
        [m, a] => (*m, None, Some(*a)),
        [m, "versions", v] => (*m, Some(*v), None),
        [m, "versions", v, a] => (*m, Some(*v), Some(*a)),
        _ => return Err(Error::not_found("no such model route").into()),
    };
    match (action, method) {
        (None, &Method::GET) => model_metadata(app, model, version),
        (Some("ready"), &Method::GET) => Ok(model_ready(app, model, version)),
        (Some("config"), &Method::GET) => model_config(app, model, version),
        (Some("stats"), &Method::GET) => {
            app.registry.entry(model)?;
            if let Some(v) = version {
                app.registry.get(model, Some(v))?;
            }
            Ok(stats(app, Some(model), version))
        }
        (Some("infer"), &Method::POST) => infer(app, model, version, req).await,
        (Some("ready" | "config" | "stats"), _) | (None, _) => {
            Ok(method_not_allowed(method, "GET"))
        }
        (Some("infer"), _) => Ok(method_not_allowed(method, "POST")),
        (Some(other), _) => Err(Error::not_found(format!("unknown model action '{other}'")).into()),
    }
}

/// 405 with an `Allow` header: the path exists, the method does not.
fn method_not_allowed(got: &Method, want: &'static str) -> Response {
    let body = json!({ "error": format!("method {got} not allowed here, use {want}") });
    let mut r = (StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response();
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(want));
    r
}

fn json_response(v: Value) -> Response {
    axum::Json(v).into_response()
}

fn server_metadata() -> Response {
    json_response(json!({
        "name": "wisp",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
}

fn server_ready(app: &AppState) -> Response {
    let ready = !app.strict_readiness || app.registry.all_ready();
    if ready {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

fn model_ready(app: &AppState, model: &str, version: Option<&str>) -> Response {
    match app.registry.check_ready(model, version) {
        Ok(_) => StatusCode::OK.into_response(),
        Err(e) if e.kind() == wisp_core::ErrorKind::NotFound => ApiError(e).into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

fn tensor_meta(name: &str, data_type: &str, dims: &[i64], batches: bool) -> Value {
    let dt = DataType::from_config_name(data_type).map_or("INVALID", |d| d.as_str());
    let shape: Vec<i64> = if batches {
        std::iter::once(-1).chain(dims.iter().copied()).collect()
    } else {
        dims.to_vec()
    };
    json!({ "name": name, "datatype": dt, "shape": shape })
}

fn ready_versions(entry: &ModelEntry) -> Vec<String> {
    entry
        .versions
        .iter()
        .filter(|(_, s)| matches!(s, VersionState::Ready(_)))
        .map(|(v, _)| v.to_string())
        .collect()
}

fn model_metadata(app: &AppState, model: &str, version: Option<&str>) -> ApiResult {
    let m = app.registry.get(model, version)?;
    let entry = app.registry.entry(model)?;
    let cfg = &m.config;
    let versions = match version {
        Some(v) => vec![v.to_string()],
        None => ready_versions(&entry),
    };
    Ok(json_response(json!({
        "name": cfg.name,
        "versions": versions,
        "platform": cfg.platform,
        "inputs": cfg.input.iter().map(|i| tensor_meta(&i.name, &i.data_type, &i.dims, cfg.batches())).collect::<Vec<_>>(),
        "outputs": cfg.output.iter().map(|o| tensor_meta(&o.name, &o.data_type, &o.dims, cfg.batches())).collect::<Vec<_>>(),
        "parameters": { "engine": m.engine },
    })))
}

fn model_config(app: &AppState, model: &str, version: Option<&str>) -> ApiResult {
    let m = app.registry.get(model, version)?;
    Ok(json_response(config_to_json(&m.config)))
}

/// Reads the body within `app.body_timeout`, bounded by `app.max_input_size`; a compressed body
/// is decoded on the blocking pool.
async fn read_body(app: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Error> {
    let secs = app.body_timeout.as_secs();
    let raw = tokio::time::timeout(
        app.body_timeout,
        read_raw(headers, body, app.max_input_size),
    )
    .await
    .map_err(|_| {
        tracing::info!(secs, "request body not received in time");
        Error::invalid(format!(
            "the request body was not received within {secs} s (--http-body-timeout-secs)"
        ))
    })??;
    match raw {
        Raw::Plain(b) => Ok(b),
        Raw::Compressed(b, kind) => {
            let limit = app.max_input_size;
            tokio::task::spawn_blocking(move || decompress(&b, kind, limit))
                .await
                .map_err(|_| Error::internal("decompression panicked"))?
        }
    }
}

/// A body as read from the wire.
enum Raw {
    Plain(Bytes),
    Compressed(Bytes, Compression),
}

#[derive(Clone, Copy)]
enum Compression {
    Gzip,
    Deflate,
}

fn decompress(raw: &[u8], kind: Compression, limit: usize) -> Result<Bytes, Error> {
    let decoder: Box<dyn Read + '_> = match kind {
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(raw)),
        Compression::Deflate => Box::new(flate2::read::ZlibDecoder::new(raw)),
    };
    let mut out = Vec::new();
    decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::invalid(format!("cannot decompress request body: {e}")))?;
    if out.len() > limit {
        return Err(Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        )));
    }
    Ok(out.into())
}

/// Reads the raw body, bounded by `limit`.
async fn read_raw(headers: &HeaderMap, body: Body, limit: usize) -> Result<Raw, Error> {
    let too_big = || {
        Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        ))
    };
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(too_big());
        }
    }
    let raw = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let msg = e.to_string();
        if msg.contains("length limit") {
            too_big()
        } else {
            Error::invalid(format!("cannot read request body: {msg}"))
        }
    })?;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("identity") => Ok(Raw::Plain(raw)),
        Some("gzip") => Ok(Raw::Compressed(raw, Compression::Gzip)),
        Some("deflate") => Ok(Raw::Compressed(raw, Compression::Deflate)),
        Some(other) => Err(Error::unsupported(format!(
            "unsupported Content-Encoding '{other}' (use gzip or deflate)"
        ))),
    }
}

/// Bodies up to this size are decoded on the async worker; larger ones on the blocking pool,
/// so that a few large requests cannot stall health checks.
const INLINE_DECODE_BYTES: usize = 64 * 1024;

/// What decoding a body may cost in memory, in KiB, charged against the in-flight budget. A
/// JSON header becomes a `serde_json::Value` tree (up to about 16 bytes of tree per byte of
/// text for dense numeric arrays, plus the typed tensor); binary data is sliced without copies.
fn decode_cost_kib(body_len: usize, header_len: Option<usize>) -> u32 {
    let json = header_len.map_or(body_len, |n| n.min(body_len));
    let bytes = (json as u64) * 16 + (body_len - json) as u64;
    u32::try_from(bytes / 1024 + 1).unwrap_or(u32::MAX)
}

/// Runs a validated request through the response cache (when the model enables it) and the
/// model's scheduler. Shared by the HTTP and gRPC front ends.
pub async fn run_infer(
    app: &AppState,
    m: &ModelVersion,
    request: &wisp_core::InferRequest,
) -> Result<wisp_core::InferResponse, Error> {
    let received = std::time::Instant::now();
    let cache = app
        .cache
        .as_ref()
        .filter(|_| m.config.response_cache.as_ref().is_some_and(|c| c.enable));
    let Some(cache) = cache else {
        return m.infer(request.clone()).await;
    };
    let lookup = std::time::Instant::now();
    let key = crate::cache::key(&m.name, m.version, request);
    if let Some(hit) = cache.get(key) {
        m.stats()
            .record_cache_hit(lookup.elapsed(), received.elapsed());
        return Ok((*hit).clone());
    }
    let miss = lookup.elapsed();
    let r = m.infer(request.clone()).await?;
    let insert = std::time::Instant::now();
    cache.insert(key, Arc::new(r.clone()));
    m.stats().cache_miss.add(miss + insert.elapsed());
    Ok(r)
}

async fn infer(app: &AppState, model: &str, version: Option<&str>, req: Request) -> ApiResult {
    let m = app.registry.get(model, version)?;
    let (parts, body) = req.into_parts();
    let header_len = match parts.headers.get(HEADER_LEN) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    Error::invalid("Inference-Header-Content-Length must be a non-negative integer")
                })?,
        ),
    };
    let received = std::time::Instant::now();
    let body = read_body(app, &parts.headers, body).await?;
    let cost = decode_cost_kib(body.len(), header_len);
    let _budget = app.budget.clone().try_acquire_many_owned(cost).map_err(|_| {
        tracing::warn!(model, bytes = body.len(), "request refused: the in-flight decode budget is spent");
        Error::unavailable(
            "the server is at its in-flight request memory budget (--max-inflight-bytes); retry later",
        )
    })?;
    let decoded = if body.len() > INLINE_DECODE_BYTES {
        let cfg = m.config.clone();
        tokio::task::spawn_blocking(move || codec::decode(body, header_len, &cfg))
            .await
            .map_err(|_| Error::internal("request decoding panicked"))?
    } else {
        codec::decode(body, header_len, &m.config)
    };
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            m.stats()
                .record_failure(FailReason::Other, received.elapsed());
            return Err(e.into());
        }
    };
    let response = run_infer(app, &m, &decoded.request).await?;
    let labels = |name: &str| m.labels.get(name).cloned();
    let enc = codec::encode(response, &decoded, &m.config, m.version, &labels)?;
    let mut resp = Response::new(Body::from(enc.body));
    let h = resp.headers_mut();
    match enc.header_len {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(HEADER_LEN, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    Ok(resp)
}

fn stat_json(s: &DurationStat) -> Value {
    let (count, ns) = s.get();
    json!({ "count": count, "ns": ns })
}

fn version_stats(m: &ModelVersion) -> Value {
    let s = m.stats();
    let batch: Vec<Value> = s
        .batch_stats()
        .into_iter()
        .map(|(size, b)| {
            json!({
                "batch_size": size,
                "compute_input": { "count": b.count, "ns": b.input_ns },
                "compute_infer": { "count": b.count, "ns": b.infer_ns },
                "compute_output": { "count": b.count, "ns": b.output_ns },
            })
        })
        .collect();
    json!({
        "name": m.name,
        "version": m.version.to_string(),
        "last_inference": s.last_inference_ms(),
        "inference_count": s.inference_count(),
        "execution_count": s.execution_count(),
        "inference_stats": {
            "success": stat_json(&s.success),
            "fail": stat_json(&s.fail),
            "queue": stat_json(&s.queue),
            "compute_input": stat_json(&s.compute_input),
            "compute_infer": stat_json(&s.compute_infer),
            "compute_output": stat_json(&s.compute_output),
            "cache_hit": stat_json(&s.cache_hit),
            "cache_miss": stat_json(&s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": batch,
        "memory_usage": [],
    })
}

/// The statistics extension: every ready version of `model` (or of every model), or one.
fn stats(app: &AppState, model: Option<&str>, version: Option<&str>) -> Response {
    let mut out = Vec::new();
    for (name, entry) in app.registry.models() {
        if model.is_some_and(|m| m != name) {
            continue;
        }
        for (v, state) in &entry.versions {
            if version.is_some_and(|want| want.parse::<u64>().ok() != Some(*v)) {
                continue;
            }
            if let VersionState::Ready(m) = state {
                out.push(version_stats(m));
            }
        }
    }
    json_response(json!({ "model_stats": out }))
}

/// The metrics front end: `GET /metrics` in Prometheus text format.
pub fn metrics_router(metrics: Arc<Metrics>, registry: Arc<Registry>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (metrics, registry) = (metrics.clone(), registry.clone());
            async move {
                let body = tokio::task::spawn_blocking(move || metrics.render(&registry))
                    .await
                    .unwrap_or_default();
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
            }
        }),
    )
}

/// Reads an optional JSON object body (empty body = `{}`).
async fn json_body(app: &AppState, req: Request) -> Result<serde_json::Map<String, Value>, Error> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(app, &parts.headers, body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::invalid("the request body must be a JSON object")),
        Err(e) => Err(Error::invalid(format!(
            "malformed JSON in request body: {e}"
        ))),
    }
}

/// The model repository extension: index, load, unload.
async fn repository(app: &AppState, rest: &[&str], req: Request) -> ApiResult {
    let registry = app.registry.clone();
    match rest {
        ["index"] | [_, "index"] => {
            let body = json_body(app, req).await?;
            let ready = match body.get("ready") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(Error::invalid("'ready' must be a boolean").into()),
            };
            let rows = registry.index(ready)?;
            let out: Vec<Value> = rows
                .into_iter()
                .map(|r| {
                    let mut o = serde_json::Map::new();
                    o.insert("name".into(), Value::from(r.name));
                    if let Some(v) = r.version {
                        o.insert("version".into(), Value::from(v.to_string()));
                    }
                    o.insert("state".into(), Value::from(r.state));
                    if !r.reason.is_empty() {
                        o.insert("reason".into(), Value::from(r.reason));
                    }
                    Value::Object(o)
                })
                .collect();
            Ok(json_response(Value::Array(out)))
        }
        [_, "models", _, "load" | "unload"] => {
            Err(Error::unsupported("'repository_name' specification is not supported").into())
        }
        ["models", model, action @ ("load" | "unload")] => {
            if app.control_mode != crate::settings::ControlMode::Explicit {
                return Err(Error::unavailable(format!(
                    "explicit model load / unload is not allowed in model control mode '{}' (start with --model-control-mode explicit)",
                    format!("{:?}", app.control_mode).to_lowercase()
                ))
                .into());
            }
            let body = json_body(app, req).await?;
            let params = match body.get("parameters") {
                None | Some(Value::Null) => serde_json::Map::new(),
                Some(Value::Object(p)) => p.clone(),
                Some(_) => return Err(Error::invalid("'parameters' must be a JSON object").into()),
            };
            let model = model.to_string();
            if *action == "load" {
                if params.keys().any(|k| k.starts_with("file:")) {
                    return Err(Error::unsupported(
                        "loading model files from the request ('file:' parameters) is not supported",
                    )
                    .into());
                }
                let config = match params.get("config") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => {
                        return Err(
                            Error::invalid("parameter 'config' must be a JSON string").into()
                        )
                    }
                };
                tokio::task::spawn_blocking(move || registry.load(&model, config.as_deref()))
                    .await
                    .map_err(|_| Error::internal("model load panicked"))??;
            } else {
                if let Some(v) = params.get("unload_dependents") {
                    if !v.is_boolean() {
                        return Err(Error::invalid(
                            "parameter 'unload_dependents' must be a boolean",
                        )
                        .into());
                    }
                }
                tokio::task::spawn_blocking(move || registry.unload(&model))
                    .await
                    .map_err(|_| Error::internal("model unload panicked"))??;
            }
            Ok(StatusCode::OK.into_response())
        }
        _ => Err(Error::not_found("no such repository route").into()),
    }
}

async fn logging_update(app: &AppState, req: Request) -> ApiResult {
    let body = json_body(app, req).await?;
    let s = app.logging.update(&body)?;
    Ok(json_response(s.to_json()))
}
