//! The shared-memory, repository, trace and logging routes.

use super::*;

/// Reads an optional JSON object body (empty body = `{}`).
pub(super) async fn json_body(
    app: &AppState,
    req: Request,
) -> Result<serde_json::Map<String, Value>, Error> {
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
pub(super) async fn trace_setting(
    app: &AppState,
    model: Option<&str>,
    method: &Method,
    req: Request,
) -> ApiResult {
    if let Some(m) = model {
        app.service.model(m, None)?;
    }
    let settings = match *method {
        Method::GET => app.service.trace().settings(model),
        _ => {
            let body = json_body(app, req).await?;
            app.service.trace().update(model, &body)?
        }
    };
    Ok(json_response(Value::Object(settings.to_json())))
}

/// The request's shared memory scope, from its `wisp-shm-token` header.
pub(super) fn shm_scope(headers: &HeaderMap) -> Result<Scope, Error> {
    Scope::from_token(headers.get(TOKEN_HEADER).map(|v| v.as_bytes()))
}

/// The system shared memory extension's `[region/{name}/]status`.
pub(super) fn shm_status(app: &AppState, region: Option<&str>, headers: &HeaderMap) -> ApiResult {
    let scope = shm_scope(headers)?;
    let rows = app.service.shm().status(&scope, region)?;
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            json!({"name": r.name, "key": r.key, "offset": r.offset,
                   "byte_size": r.byte_size})
        })
        .collect();
    Ok(json_response(Value::Array(rows)))
}

/// `region/{name}/register`: a JSON object `{"key", "offset", "byte_size"}`.
pub(super) async fn shm_register(app: &AppState, name: &str, req: Request) -> ApiResult {
    let scope = shm_scope(req.headers())?;
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

/// `[region/{name}/]unregister`: one region, or every region of the caller's scope.
pub(super) fn shm_unregister(
    app: &AppState,
    region: Option<&str>,
    headers: &HeaderMap,
) -> ApiResult {
    let scope = shm_scope(headers)?;
    app.service.shm().unregister(&scope, region);
    Ok(StatusCode::OK.into_response())
}

/// The index request's `ready` flag. The body is read as a typed request, not as a JSON tree,
/// so a `ready` that is not a boolean is refused at its first byte in Triton's words however
/// deeply it nests (Triton's QA sends 250 000 nested arrays), and other keys are skipped.
async fn index_ready(app: &AppState, req: Request) -> Result<bool, Error> {
    #[derive(serde::Deserialize)]
    struct Index {
        #[serde(default)]
        ready: Option<bool>,
    }
    let (parts, body) = req.into_parts();
    let (bytes, _charge) = read_body(app, &parts.headers, body).await?;
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Ok(false),
        Some(b'{') => {}
        Some(_) => return Err(Error::invalid("the request body must be a JSON object")),
    }
    match serde_json::from_slice::<Index>(&bytes) {
        Ok(index) => Ok(index.ready.unwrap_or(false)),
        Err(e) if e.classify() == serde_json::error::Category::Data => Err(Error::invalid(
            "Invalid value for 'ready': expected a boolean",
        )),
        Err(e) => Err(Error::invalid(format!(
            "malformed JSON in request body: {e}"
        ))),
    }
}

/// The model repository extension's index.
pub(super) async fn repository_index(app: &AppState, req: Request) -> ApiResult {
    let ready = index_ready(app, req).await?;
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

/// Which of the repository's control routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Control {
    Load,
    Unload,
}

/// `…/models/{m}/load` and `…/unload`: the parameters are parsed here, the policy is the
/// service's.
pub(super) async fn control(
    app: &AppState,
    repository: &str,
    model: &str,
    action: Control,
    req: Request,
) -> ApiResult {
    // Refused before the body is read: a closed control plane costs nothing to parse.
    app.service.check_control(repository, Caller::Http)?;
    let body = json_body(app, req).await?;
    let params = match body.get("parameters") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Err(Error::invalid("'parameters' must be a JSON object").into()),
    };
    if action == Control::Load {
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

pub(super) async fn logging_update(app: &AppState, req: Request) -> ApiResult {
    let body = json_body(app, req).await?;
    let s = app.service.log_settings(&body)?;
    Ok(json_response(s.to_json()))
}
