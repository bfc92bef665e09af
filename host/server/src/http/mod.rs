//! The HTTP/REST front end: every KServe v2 route this server supports, dispatched through one
//! table ([`route::TABLE`]) that also gives each route its methods and restricted-API group
//! (model names may hold any character but `/`).
//!
//! A thin codec over the [`Service`]: each route parses its request, calls the service and
//! encodes the answer; errors become statuses in [`error::status`].
//!
//! Request flow for `POST /v2/models/{m}[/versions/{v}]/infer`: check the restricted groups,
//! read the body (bounded by `--http-max-input-size` and `--http-body-timeout-secs`,
//! gzip/deflate decoded), charge the decode budget, resolve the model version, decode
//! ([`codec::decode`]), [`Service::infer`] (validate, cache, schedule, select outputs), encode
//! ([`codec::encode`]).

mod admin;
mod body;
mod generate;
pub mod route;

use admin::{
    control, logging_update, repository_index, shm_register, shm_scope, shm_status, shm_unregister,
    trace_setting, Control,
};
pub(crate) use body::read_body;
use body::{decode_cost, INLINE_DECODE_BYTES};

pub mod codec;
pub mod error;
pub mod openai;
#[cfg(test)]
mod tests;

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

use crate::service::control::{Caller, LoadRequest};
use crate::service::query::{Duration, TensorMetadata, VersionStats};
use crate::service::shm::{Scope, TOKEN_HEADER};
use crate::service::{Charge, Service};
use error::ApiError;
use route::Kind;

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

/// The router: one fallback handler that dispatches on the path through [`route::TABLE`].
pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new().fallback(dispatch).with_state(state)
}

async fn dispatch(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let method = req.method().clone();
    let Some((entry, p)) = route::find(&segs) else {
        let (message, openai) = route::not_found(&segs, method.as_str(), &path);
        if openai {
            let failure = crate::service::openai::ApiFailure {
                error: Error::not_found(message),
                param: None,
                code: Some("unknown_url"),
            };
            return openai::error_response(failure);
        }
        return ApiError(Error::not_found(message)).into_response();
    };
    // Triton's order: the group's header first, then the method.
    let headers = req.headers();
    if let Err(header) = app
        .restricted
        .check(entry.group, |h| headers.get(h).map(|v| v.as_bytes()))
    {
        let message = format!("This API is restricted, expecting header '{header}'");
        if entry.openai() {
            return openai::error_with_status(StatusCode::FORBIDDEN, &message, None, None);
        }
        let body = json!({ "error": message });
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    if !entry.allows(method.as_str()) {
        if entry.openai() {
            return openai::not_allowed(&method, entry.allow);
        }
        return method_not_allowed(&method, entry.allow);
    }
    let (model, version) = (p.model, p.version);
    let result = match entry.kind {
        Kind::ServerMetadata => Ok(server_metadata(&app)),
        Kind::Live => Ok(StatusCode::OK.into_response()),
        Kind::ServerReady => Ok(server_ready(&app)),
        Kind::AllStats => stats(&app, None, None),
        Kind::ModelMetadata => model_metadata(&app, model, version),
        Kind::ModelReady => Ok(model_ready(&app, model, version)),
        Kind::ModelConfig => model_config(&app, model, version),
        Kind::ModelStats => stats(&app, Some(model), version),
        Kind::Infer => infer(&app, model, version, req).await,
        Kind::Generate => generate::generate(&app, model, version, req, false).await,
        Kind::GenerateStream => generate::generate(&app, model, version, req, true).await,
        Kind::ModelTrace => trace_setting(&app, Some(model), &method, req).await,
        Kind::Trace => trace_setting(&app, None, &method, req).await,
        Kind::Logging if method == Method::GET => app
            .service
            .log_settings(&Default::default())
            .map(|s| json_response(s.to_json()))
            .map_err(ApiError),
        Kind::Logging => logging_update(&app, req).await,
        Kind::RepositoryIndex => repository_index(&app, req).await,
        Kind::Load => control(&app, p.repository, model, Control::Load, req).await,
        Kind::Unload => control(&app, p.repository, model, Control::Unload, req).await,
        Kind::ShmStatus => shm_status(&app, p.region, req.headers()),
        Kind::ShmRegister => shm_register(&app, p.region.unwrap_or_default(), req).await,
        Kind::ShmUnregister => shm_unregister(&app, p.region, req.headers()),
        Kind::CudaShm => Err(crate::service::shm::cuda_unsupported().into()),
        Kind::Embeddings => {
            return openai::embeddings(&app, req)
                .await
                .unwrap_or_else(openai::error_response)
        }
        Kind::OpenAiModels => return openai::models(&app),
        Kind::OpenAiModel => return openai::model(&app, p.id),
    };
    result.unwrap_or_else(IntoResponse::into_response)
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
    let mut parameters = json!({ "engine": m.engine });
    if let Some(gate) = m.gate {
        parameters["gate"] = json!(gate);
    }
    Ok(json_response(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": m.inputs.iter().map(tensor_json).collect::<Vec<_>>(),
        "outputs": m.outputs.iter().map(tensor_json).collect::<Vec<_>>(),
        "parameters": parameters,
    })))
}

fn model_config(app: &AppState, model: &str, version: Option<&str>) -> ApiResult {
    let cfg = app.service.model_config(model, version)?;
    Ok(json_response(config_to_json(&cfg)))
}

async fn infer(app: &AppState, model: &str, version: Option<&str>, req: Request) -> ApiResult {
    let m = app.service.model(model, version)?;
    if m.config.decoupled() {
        return Err(Error::unsupported(
            "HTTP end point doesn't support models with decoupled transaction policy",
        )
        .into());
    }
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
    let (decoded, _budget) = if json_len > INLINE_DECODE_BYTES {
        let sig = m.signature.clone();
        tokio::task::spawn_blocking(move || {
            let decoded = codec::decode(body, header_len, &sig, &mut budget);
            (decoded, budget)
        })
        .await
        .map_err(|_| Error::internal("request decoding panicked"))?
    } else {
        (
            codec::decode(body, header_len, &m.signature, &mut budget),
            budget,
        )
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
    // Large answers (JSON text of megabytes of numbers) are encoded off the async workers, so
    // that health checks and other connections are not kept waiting behind them.
    let enc = if answer_bytes(&answer) > INLINE_DECODE_BYTES {
        tokio::task::spawn_blocking(move || codec::encode(&answer))
            .await
            .map_err(|_| Error::internal("response encoding panicked"))?
    } else {
        codec::encode(&answer)
    };
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

/// The bytes an answer's tensors hold.
pub(crate) fn answer_bytes(answer: &crate::service::Answer) -> usize {
    answer.outputs.iter().map(|(_, t)| t.data.len()).sum()
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
    let mut out = json!({
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
    });
    // Wisp's addition for an ensemble: how often each step was skipped by dataflow
    if !s.skipped_steps.is_empty() {
        out["skipped_steps"] = s
            .skipped_steps
            .iter()
            .enumerate()
            .map(|(n, (model, count))| json!({ "step": n, "model": model, "count": count }))
            .collect();
    }
    out
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

/// A client's W3C `traceparent` header, when it has a valid one (the parent of its trace).
pub(crate) fn trace_parent(headers: &HeaderMap) -> Option<wisp_core::trace::TraceParent> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(wisp_core::trace::TraceParent::parse)
}
