//! The HTTP/REST front end: every KServe v2 route this server supports, dispatched from the
//! path as Triton's `http_server.cc` does (model names may hold any character but `/`).
//!
//! A thin codec over the [`Service`]: each route parses its request, calls the service and
//! encodes the answer; errors become statuses in [`error::status`].
//!
//! Request flow for `POST /v2/models/{m}[/versions/{v}]/infer`: check the restricted groups,
//! read the body (bounded by `--http-max-input-size` and `--http-body-timeout-secs`,
//! gzip/deflate decoded), charge the decode budget, resolve the model version, decode
//! ([`codec::decode`]), [`Service::infer`] (validate, cache, schedule, select outputs), encode
//! ([`codec::encode`]).

pub mod codec;
pub mod error;
pub mod openai;

use std::io::Read;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use wisp_core::config::config_to_json;
use wisp_core::Error;

use crate::metrics::Metrics;
use crate::models::Registry;
use crate::service::control::{Caller, LoadRequest};
use crate::service::query::{Duration, TensorMetadata, VersionStats};
use crate::service::shm::{Scope, TOKEN_HEADER};
use crate::service::{Charge, Service};
use error::ApiError;

/// The header carrying the JSON length when binary tensor data follows it.
pub const HEADER_LEN: &str = "inference-header-content-length";

/// Shared state of the HTTP front end.
pub struct AppState {
    /// The service every route calls.
    pub service: Arc<Service>,
    /// Largest accepted body (after decompression).
    pub max_input_size: usize,
    /// How long a client has to send a whole body (`--http-body-timeout-secs`).
    pub body_timeout: std::time::Duration,
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
            let message = format!("This API is restricted, expecting header '{header}'");
            if segs.first() == Some(&"v1") {
                return openai::error_with_status(StatusCode::FORBIDDEN, &message, None, None);
            }
            let body = json!({ "error": message });
            return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
        }
    }
    if segs.first() == Some(&"v1") {
        return openai::route(&app, &segs, &method, req).await;
    }
    let result = match (segs.as_slice(), &method) {
        (["v2"], &Method::GET) => Ok(server_metadata(&app)),
        (["v2", "health", "live"], &Method::GET) => Ok(StatusCode::OK.into_response()),
        (["v2", "health", "ready"], &Method::GET) => Ok(server_ready(&app)),
        (["v2", "models", "stats"], &Method::GET) => stats(&app, None, None),
        (["v2", "repository", rest @ ..], &Method::POST) => repository(&app, rest, req).await,
        (["v2", "logging"], &Method::GET) => app
            .service
            .log_settings(&Default::default())
            .map(|s| json_response(s.to_json()))
            .map_err(ApiError),
        (["v2", "logging"], &Method::POST) => logging_update(&app, req).await,
        (["v2", "trace", "setting"], _) => trace_setting(&app, None, &method, req).await,
        (["v2", "models", model, "trace", "setting"], _) => {
            trace_setting(&app, Some(model), &method, req).await
        }
        (["v2", "systemsharedmemory", rest @ ..], _) => {
            system_shared_memory(&app, rest, &method, req).await
        }
        (["v2", "cudasharedmemory", ..], _) => Err(crate::grpc::cuda_unsupported().into()),
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
        (Some("stats"), &Method::GET) => stats(app, Some(model), version),
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

fn server_metadata(app: &AppState) -> Response {
    let m = app.service.server_metadata();
    json_response(json!({
        "name": m.name,
        "version": m.version,
        "extensions": m.extensions,
    }))
}

fn server_ready(app: &AppState) -> Response {
    if app.service.server_ready() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

fn model_ready(app: &AppState, model: &str, version: Option<&str>) -> Response {
    // Triton answers 400 for a model that is not ready, whether unknown, unloaded or
    // failed; the body says which.
    match app.service.model_ready(model, version) {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(why)) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "error": why.message() })),
        )
            .into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

fn tensor_json(t: &TensorMetadata) -> Value {
    json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape })
}

fn model_metadata(app: &AppState, model: &str, version: Option<&str>) -> ApiResult {
    let m = app.service.model_metadata(model, version)?;
    Ok(json_response(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": m.inputs.iter().map(tensor_json).collect::<Vec<_>>(),
        "outputs": m.outputs.iter().map(tensor_json).collect::<Vec<_>>(),
        "parameters": { "engine": m.engine },
    })))
}

fn model_config(app: &AppState, model: &str, version: Option<&str>) -> ApiResult {
    let cfg = app.service.model_config(model, version)?;
    Ok(json_response(config_to_json(&cfg)))
}

/// Reads the body within `app.body_timeout`, bounded by `app.max_input_size`; a compressed body
/// is decoded on the blocking pool. The body is charged to the in-flight budget as it arrives
/// and as it inflates, before the memory is spent: the returned charge covers what it holds
/// (a gzip bomb stops at the budget, with 503, not after it has inflated).
async fn read_body(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Charge), Error> {
    let secs = app.body_timeout.as_secs();
    let mut charge = Charge::new(&app.service.budget);
    let raw = tokio::time::timeout(
        app.body_timeout,
        read_raw(headers, body, app.max_input_size, &mut charge),
    )
    .await
    .map_err(|_| {
        tracing::info!(secs, "request body not received in time");
        Error::invalid(format!(
            "the request body was not received within {secs} s (--http-body-timeout-secs)"
        ))
    })??;
    match raw {
        Raw::Plain(b) => Ok((b, charge)),
        Raw::Compressed(b, kind) => {
            let limit = app.max_input_size;
            tokio::task::spawn_blocking(move || {
                let out = decompress(&b, kind, limit, &mut charge)?;
                Ok((out, charge))
            })
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

/// Inflates `raw` up to `limit` bytes, charging `charge` for the compressed and inflated bytes
/// together as the output grows, a chunk at a time.
fn decompress(
    raw: &[u8],
    kind: Compression,
    limit: usize,
    charge: &mut Charge,
) -> Result<Bytes, Error> {
    const CHUNK: usize = 64 * 1024;
    let mut decoder: Box<dyn Read + '_> = match kind {
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(raw)),
        Compression::Deflate => Box::new(flate2::read::ZlibDecoder::new(raw)),
    };
    let too_big = || {
        Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        ))
    };
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.len() > limit {
            return Err(too_big());
        }
        let at = out.len();
        reserve_charged(&mut out, CHUNK, limit + CHUNK + 1, raw.len(), charge)?;
        out.resize(at + CHUNK, 0);
        let n = match decoder.read(&mut out[at..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => {
                return Err(Error::invalid(format!(
                    "cannot decompress request body: {e}"
                )))
            }
        };
        out.truncate(at + n);
        if n == 0 {
            break;
        }
    }
    if out.len() > limit {
        return Err(too_big());
    }
    Ok(out.into())
}

/// Makes room in `buf` for `extra` more bytes, charging `charge` for the new capacity (plus
/// `held` bytes kept elsewhere) before it is allocated: grown by doubling, as `Vec` would,
/// but never past `most` unless `extra` needs it.
fn reserve_charged(
    buf: &mut Vec<u8>,
    extra: usize,
    most: usize,
    held: usize,
    charge: &mut Charge,
) -> Result<(), Error> {
    let need = buf.len() + extra;
    if buf.capacity() >= need {
        return Ok(());
    }
    let cap = (buf.capacity() * 2).min(most).max(need);
    charge.grow_to((held + cap) as u64)?;
    buf.reserve_exact(cap - buf.len());
    Ok(())
}

/// Reads the raw body, bounded by `limit`, charging `charge` for each frame as it arrives.
async fn read_raw(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    charge: &mut Charge,
) -> Result<Raw, Error> {
    use http_body_util::BodyExt;
    let too_big = || {
        Error::too_large(format!(
            "request body exceeds the maximum of {limit} bytes (--http-max-input-size)"
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_big());
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::invalid(format!("cannot read request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let held = first.as_ref().map_or(0, Bytes::len) + rest.len();
        if held + data.len() > limit {
            return Err(too_big());
        }
        charge.grow_to((held + data.len()) as u64)?;
        match &first {
            // One frame is kept as it came (no copy), as most bodies are one frame.
            None => first = Some(data),
            Some(f) => {
                // The declared length is room reserved at once, so it is charged first too.
                let first_len = if rest.is_empty() { f.len() } else { 0 };
                let extra = first_len + data.len();
                let want = declared.unwrap_or(0).max(rest.len() + extra) - rest.len();
                reserve_charged(&mut rest, want, limit, f.len(), charge)?;
                if first_len > 0 {
                    rest.extend_from_slice(f);
                }
                rest.extend_from_slice(&data);
            }
        }
    }
    let raw = match (first, rest.is_empty()) {
        (Some(f), true) => f,
        (None, _) => Bytes::new(),
        (Some(_), false) => Bytes::from(rest),
    };
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

/// Requests whose JSON part is up to this size are decoded on the async worker; larger ones on
/// the blocking pool, so that a few large requests cannot stall health checks. Binary tensor
/// data is sliced, not decoded, so it does not count.
const INLINE_DECODE_BYTES: usize = 64 * 1024;

/// What a body may cost in memory while its request runs, in KiB, charged against the
/// in-flight budget: the body itself, plus for its JSON part the tensors decoded from it (at
/// most 4 bytes per byte of text: FP64 from `1,`); binary data is sliced without copies.
fn decode_cost(body_len: usize, header_len: Option<usize>) -> u64 {
    let json = header_len.map_or(body_len, |n| n.min(body_len));
    (json as u64) * 5 + (body_len - json) as u64
}

async fn infer(app: &AppState, model: &str, version: Option<&str>, req: Request) -> ApiResult {
    let m = app.service.model(model, version)?;
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
    let (body, mut budget) = read_body(app, &parts.headers, body).await?;
    budget.grow_to(decode_cost(body.len(), header_len))?;
    let json_len = header_len.map_or(body.len(), |n| n.min(body.len()));
    let decoded = if json_len > INLINE_DECODE_BYTES {
        let sig = m.signature.clone();
        tokio::task::spawn_blocking(move || codec::decode(body, header_len, &sig))
            .await
            .map_err(|_| Error::internal("request decoding panicked"))?
    } else {
        codec::decode(body, header_len, &m.signature)
    };
    let scope = shm_scope(&parts.headers)?;
    let decoded = decoded.map(|mut d| {
        d.shm_scope = scope;
        d
    });
    let trace_parent = trace_parent(&parts.headers);
    let answer = app
        .service
        .infer(m, decoded, received, trace_parent)
        .await?;
    let enc = codec::encode(&answer);
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

fn duration_json(d: Duration) -> Value {
    json!({ "count": d.count, "ns": d.ns })
}

fn version_stats_json(s: &VersionStats) -> Value {
    let batch: Vec<Value> = s
        .batches
        .iter()
        .map(|b| {
            json!({
                "batch_size": b.batch_size,
                "compute_input": { "count": b.count, "ns": b.input_ns },
                "compute_infer": { "count": b.count, "ns": b.infer_ns },
                "compute_output": { "count": b.count, "ns": b.output_ns },
            })
        })
        .collect();
    json!({
        "name": s.name,
        "version": s.version.to_string(),
        "last_inference": s.last_inference,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": duration_json(s.success),
            "fail": duration_json(s.fail),
            "queue": duration_json(s.queue),
            "compute_input": duration_json(s.compute_input),
            "compute_infer": duration_json(s.compute_infer),
            "compute_output": duration_json(s.compute_output),
            "cache_hit": duration_json(s.cache_hit),
            "cache_miss": duration_json(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": batch,
        "memory_usage": [],
    })
}

/// The statistics extension: every ready version of `model` (or of every model), or one.
fn stats(app: &AppState, model: Option<&str>, version: Option<&str>) -> ApiResult {
    let out: Vec<Value> = app
        .service
        .statistics(model, version)?
        .iter()
        .map(version_stats_json)
        .collect();
    Ok(json_response(json!({ "model_stats": out })))
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
    let (bytes, _charge) = read_body(app, &parts.headers, body).await?;
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

/// The trace extension's settings, global or for `model`: GET reads them, POST updates them
/// (a JSON object of Triton's settings; `null` clears a model's own setting).
async fn trace_setting(
    app: &AppState,
    model: Option<&str>,
    method: &Method,
    req: Request,
) -> ApiResult {
    if let Some(m) = model {
        app.service.model(m, None)?;
    }
    let settings = match *method {
        Method::GET => app.service.trace.settings(model),
        Method::POST => {
            let body = json_body(app, req).await?;
            app.service.trace.update(model, &body)?
        }
        _ => return Ok(method_not_allowed(method, "GET, POST")),
    };
    Ok(json_response(Value::Object(settings.to_json())))
}

/// The request's shared memory scope, from its `wisp-shm-token` header.
fn shm_scope(headers: &HeaderMap) -> Result<Scope, Error> {
    Scope::from_token(headers.get(TOKEN_HEADER).map(|v| v.as_bytes()))
}

/// The system shared memory extension: `[region/{name}/]status` (GET), `region/{name}/register`
/// (POST `{"key", "offset", "byte_size"}`), `[region/{name}/]unregister` (POST).
async fn system_shared_memory(
    app: &AppState,
    rest: &[&str],
    method: &Method,
    req: Request,
) -> ApiResult {
    let (name, action) = match rest {
        [a] => (None, *a),
        ["region", n, a] => (Some(*n), *a),
        _ => return Err(Error::not_found("no such shared memory route").into()),
    };
    let scope = shm_scope(req.headers())?;
    match (action, method, name) {
        ("status", &Method::GET, _) => {
            let rows = app.service.shm.status(&scope, name)?;
            let rows: Vec<Value> = rows
                .into_iter()
                .map(|r| {
                    json!({"name": r.name, "key": r.key, "offset": r.offset,
                           "byte_size": r.byte_size})
                })
                .collect();
            Ok(json_response(Value::Array(rows)))
        }
        ("register", &Method::POST, Some(name)) => {
            let body = json_body(app, req).await?;
            let key = body
                .get("key")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::invalid("shared memory registration needs a string 'key'"))?;
            let number = |field: &str, required: bool| -> Result<usize, Error> {
                match body.get(field) {
                    None if !required => Ok(0),
                    v => v
                        .and_then(Value::as_u64)
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "shared memory registration needs a non-negative integer '{field}'"
                            ))
                        }),
                }
            };
            let (offset, byte_size) = (number("offset", false)?, number("byte_size", true)?);
            let (name, key) = (name.to_string(), key.to_string());
            app.service
                .clone()
                .register_shm(scope, name, key, offset, byte_size)
                .await?;
            Ok(StatusCode::OK.into_response())
        }
        ("unregister", &Method::POST, _) => {
            app.service.shm.unregister(&scope, name);
            Ok(StatusCode::OK.into_response())
        }
        ("status", _, _) => Ok(method_not_allowed(method, "GET")),
        ("register" | "unregister", _, _) => Ok(method_not_allowed(method, "POST")),
        _ => Err(Error::not_found(format!("unknown shared memory action '{action}'")).into()),
    }
}

/// The model repository extension: index, load, unload.
async fn repository(app: &AppState, rest: &[&str], req: Request) -> ApiResult {
    match rest {
        ["index"] | [_, "index"] => {
            let body = json_body(app, req).await?;
            let ready = match body.get("ready") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(Error::invalid("'ready' must be a boolean").into()),
            };
            let rows = app.service.index(ready)?;
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
        ["models", model, action @ ("load" | "unload")] => {
            control(app, "", model, action, req).await
        }
        [repository, "models", model, action @ ("load" | "unload")] => {
            control(app, repository, model, action, req).await
        }
        _ => Err(Error::not_found("no such repository route").into()),
    }
}

/// `…/models/{m}/load` and `…/unload`: the parameters are parsed here, the policy is the
/// service's.
async fn control(
    app: &AppState,
    repository: &str,
    model: &str,
    action: &str,
    req: Request,
) -> ApiResult {
    let body = json_body(app, req).await?;
    let params = match body.get("parameters") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Err(Error::invalid("'parameters' must be a JSON object").into()),
    };
    if action == "load" {
        let config = match params.get("config") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(Error::invalid("parameter 'config' must be a string").into()),
        };
        let mut files = Vec::new();
        for (key, value) in &params {
            let Some(path) = key.strip_prefix("file:") else {
                continue;
            };
            let text = value.as_str().ok_or_else(|| {
                Error::invalid(format!("parameter '{key}' must be a base64 string"))
            })?;
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Error::invalid(format!("parameter '{key}' is not base64: {e}")))?;
            files.push((path.to_string(), data));
        }
        let load = LoadRequest {
            caller: Caller::Http,
            repository: repository.to_string(),
            config,
            files,
        };
        app.service.load(model, load).await?;
    } else {
        let dependents = match params.get("unload_dependents") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(
                    Error::invalid("parameter 'unload_dependents' must be a boolean").into(),
                )
            }
        };
        app.service
            .unload(model, repository, dependents, Caller::Http)
            .await?;
    }
    Ok(StatusCode::OK.into_response())
}

async fn logging_update(app: &AppState, req: Request) -> ApiResult {
    let body = json_body(app, req).await?;
    let s = app.service.log_settings(&body)?;
    Ok(json_response(s.to_json()))
}

/// A client's W3C `traceparent` header, when it has a valid one (the parent of its trace).
pub(crate) fn trace_parent(headers: &HeaderMap) -> Option<wisp_core::trace::TraceParent> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(wisp_core::trace::TraceParent::parse)
}
