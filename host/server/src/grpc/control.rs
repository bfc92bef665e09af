//! The repository's load and unload, trace settings and log settings.

use super::*;

pub(super) async fn repository_model_load(
    svc: &GrpcService,
    r: Request<pb::RepositoryModelLoadRequest>,
) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
    use pb::model_repository_parameter::ParameterChoice as C;
    let r = r.into_inner();
    let config = match r
        .parameters
        .get("config")
        .and_then(|p| p.parameter_choice.clone())
    {
        None => None,
        Some(C::StringParam(s)) => Some(s),
        Some(_) => {
            return Err(status(Error::invalid(
                "parameter 'config' must be a string",
            )))
        }
    };
    let mut files = Vec::new();
    for (key, value) in r.parameters {
        let Some(path) = key.strip_prefix("file:") else {
            continue;
        };
        match value.parameter_choice {
            Some(C::BytesParam(data)) => files.push((path.to_string(), data)),
            _ => {
                return Err(status(Error::invalid(format!(
                    "parameter '{key}' must be bytes"
                ))))
            }
        }
    }
    let load = LoadRequest {
        caller: Caller::Grpc,
        repository: r.repository_name,
        config,
        files,
    };
    svc.service
        .load(&r.model_name, load)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::RepositoryModelLoadResponse {}))
}

pub(super) async fn repository_model_unload(
    svc: &GrpcService,
    r: Request<pb::RepositoryModelUnloadRequest>,
) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
    let r = r.into_inner();
    use pb::model_repository_parameter::ParameterChoice;
    let dependents = match r
        .parameters
        .get("unload_dependents")
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => false,
        Some(ParameterChoice::BoolParam(b)) => *b,
        Some(_) => {
            return Err(status(Error::invalid(
                "parameter 'unload_dependents' must be a boolean",
            )))
        }
    };
    svc.service
        .unload(&r.model_name, &r.repository_name, dependents, Caller::Grpc)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
}

pub(super) async fn trace_setting(
    svc: &GrpcService,
    r: Request<pb::TraceSettingRequest>,
) -> Result<Response<pb::TraceSettingResponse>, Status> {
    let r = r.into_inner();
    let model = (!r.model_name.is_empty()).then_some(r.model_name.as_str());
    if let Some(m) = model {
        svc.service.model(m, None).map_err(status)?;
    }
    // Triton's gRPC form: every value a list of strings; an empty list clears a setting.
    let update: serde_json::Map<String, serde_json::Value> = r
        .settings
        .into_iter()
        .map(|(k, v)| {
            let value = match v.value.as_slice() {
                [] => serde_json::Value::Null,
                [one] if k != "trace_level" => one.clone().into(),
                many => many.to_vec().into(),
            };
            (k, value)
        })
        .collect();
    let settings = if update.is_empty() {
        svc.service.trace().settings(model)
    } else if model.is_none() && update.values().any(serde_json::Value::is_null) {
        return Err(status(Error::invalid(
            "a global trace setting cannot be cleared, only set",
        )));
    } else {
        svc.service.trace().update(model, &update).map_err(status)?
    };
    let settings = settings
        .to_json()
        .into_iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::Array(a) => a
                    .into_iter()
                    .map(|x| x.as_str().unwrap_or_default().to_string())
                    .collect(),
                serde_json::Value::String(s) => vec![s],
                other => vec![other.to_string()],
            };
            (k, pb::trace_setting_response::SettingValue { value })
        })
        .collect();
    Ok(Response::new(pb::TraceSettingResponse { settings }))
}

pub(super) async fn log_settings(
    svc: &GrpcService,
    r: Request<pb::LogSettingsRequest>,
) -> Result<Response<pb::LogSettingsResponse>, Status> {
    use pb::log_settings_request::setting_value::ParameterChoice as In;
    use pb::log_settings_response::setting_value::ParameterChoice as Out;
    let mut update = serde_json::Map::new();
    for (k, v) in r.into_inner().settings {
        let value = match v.parameter_choice {
            Some(In::BoolParam(b)) => b.into(),
            Some(In::Uint32Param(u)) => u.into(),
            Some(In::StringParam(s)) => s.into(),
            None => continue,
        };
        update.insert(k, value);
    }
    let s = svc.service.log_settings(&update).map_err(status)?;
    let mut settings = HashMap::new();
    let mut put = |k: &str, v: Out| {
        settings.insert(
            k.to_string(),
            pb::log_settings_response::SettingValue {
                parameter_choice: Some(v),
            },
        );
    };
    put("log_file", Out::StringParam(s.log_file));
    put("log_info", Out::BoolParam(s.log_info));
    put("log_warning", Out::BoolParam(s.log_warning));
    put("log_error", Out::BoolParam(s.log_error));
    put(
        "log_verbose_level",
        Out::Uint32Param(s.log_verbose_level as u32),
    );
    put("log_format", Out::StringParam(s.log_format));
    Ok(Response::new(pb::LogSettingsResponse { settings }))
}
