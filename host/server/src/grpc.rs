//! The gRPC front end: Triton's `inference.GRPCInferenceService` (plus the standard
//! `grpc.health.v1.Health`) over tonic, a thin codec over the [`Service`] the HTTP front end
//! also calls. Errors map to gRPC codes in [`status`], the one place that does it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use wisp_core::tensor::encode_bytes_elements;
use wisp_core::{DataType, Error, ErrorKind, InferRequest, Tensor};

use crate::service::control::LoadRequest;
use crate::service::query::{Duration, TensorMetadata};
use crate::service::{Decoded, OutputSpec, Service, MAX_CLASSIFICATION};

#[allow(missing_docs, clippy::all, clippy::pedantic)]
/// Messages and service traits generated from `proto/grpc_service.proto`.
pub mod pb {
    tonic::include_proto!("inference");
}

use pb::grpc_inference_service_server::GrpcInferenceService;
pub use pb::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The gRPC status for an error: Triton's mapping.
pub fn status(e: Error) -> Status {
    let code = match e.kind() {
        ErrorKind::InvalidArg => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::Unsupported => tonic::Code::Unimplemented,
        ErrorKind::AlreadyExists => tonic::Code::AlreadyExists,
        ErrorKind::Internal => tonic::Code::Internal,
        ErrorKind::TooLarge => tonic::Code::ResourceExhausted,
    };
    Status::new(code, e.message().to_string())
}

/// Runs before every gRPC call: refuses calls to restricted groups that lack their header
/// (Triton's `--grpc-restricted-protocol`: UNAVAILABLE, Triton's message), and reports a request
/// over `--grpc-max-message-size` as RESOURCE_EXHAUSTED, gRPC's code for it, where tonic says
/// OUT_OF_RANGE. (A unary call's size error is in the response headers, which is where it is
/// rewritten; on a stream it arrives later, in the trailers, and keeps tonic's code.)
pub async fn guard(
    axum::extract::State(restricted): axum::extract::State<Arc<crate::restricted::Restrictions>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(group) = crate::restricted::ApiGroup::of_grpc(req.uri().path()) {
        let headers = req.headers();
        if let Err(header) = restricted.check(group, |h| headers.get(h).map(|v| v.as_bytes())) {
            return Status::unavailable(format!(
                "This protocol is restricted, expecting header '{header}'"
            ))
            .into_http();
        }
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    let oversize = h.get("grpc-status").is_some_and(|v| v == "11")
        && h.get("grpc-message").is_some_and(|m| {
            let m = m.as_bytes();
            m.windows(9).any(|w| w == b"too large") || m.windows(11).any(|w| w == b"too%20large")
        });
    if oversize {
        h.insert(
            "grpc-status",
            axum::http::HeaderValue::from(tonic::Code::ResourceExhausted as i32),
        );
    }
    resp
}

/// The service.
pub struct GrpcService {
    service: Arc<Service>,
    stream_in_flight: usize,
}

impl GrpcService {
    /// A gRPC front end over `service`; `stream_in_flight` bounds the requests of one
    /// `ModelStreamInfer` stream in flight (`--grpc-stream-max-in-flight`).
    pub fn new(service: Arc<Service>, stream_in_flight: usize) -> Self {
        GrpcService {
            service,
            stream_in_flight: stream_in_flight.max(1),
        }
    }
}

fn param_to_json(p: &pb::InferParameter) -> serde_json::Value {
    use pb::infer_parameter::ParameterChoice as C;
    match &p.parameter_choice {
        Some(C::BoolParam(b)) => (*b).into(),
        Some(C::Int64Param(i)) => (*i).into(),
        Some(C::StringParam(s)) => s.clone().into(),
        Some(C::DoubleParam(d)) => (*d).into(),
        Some(C::Uint64Param(u)) => (*u).into(),
        None => serde_json::Value::Null,
    }
}

/// `contents` (typed repeated fields) → little-endian bytes.
fn contents_to_bytes(
    name: &str,
    dt: DataType,
    c: &pb::InferTensorContents,
) -> Result<Vec<u8>, Error> {
    let out: Vec<u8> = match dt {
        DataType::Bool => c.bool_contents.iter().map(|&b| b as u8).collect(),
        DataType::Int8 => c.int_contents.iter().map(|&v| v as i8 as u8).collect(),
        DataType::Int16 => c
            .int_contents
            .iter()
            .flat_map(|&v| (v as i16).to_le_bytes())
            .collect(),
        DataType::Int32 => c
            .int_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Int64 => c
            .int64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint8 => c.uint_contents.iter().map(|&v| v as u8).collect(),
        DataType::Uint16 => c
            .uint_contents
            .iter()
            .flat_map(|&v| (v as u16).to_le_bytes())
            .collect(),
        DataType::Uint32 => c
            .uint_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Uint64 => c
            .uint64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp32 => c
            .fp32_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Fp64 => c
            .fp64_contents
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DataType::Bytes => encode_bytes_elements(c.bytes_contents.iter()),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(Error::invalid(format!(
                "input '{name}': {dt} data must be sent in raw_input_contents"
            )))
        }
    };
    Ok(out)
}

/// A `ModelInferRequest` → the service's [`Decoded`] (the service validates it against the
/// model).
pub(crate) fn decode(req: pb::ModelInferRequest) -> Result<Decoded, Error> {
    if !req.raw_input_contents.is_empty() && req.raw_input_contents.len() != req.inputs.len() {
        return Err(Error::invalid(format!(
            "expected {} raw_input_contents (one per input), got {}",
            req.inputs.len(),
            req.raw_input_contents.len()
        )));
    }
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for (i, t) in req.inputs.into_iter().enumerate() {
        let dt =
            DataType::parse(&t.datatype).map_err(|e| e.context(format!("input '{}'", t.name)))?;
        if t.shape.iter().any(|&d| d < 0) {
            return Err(Error::invalid(format!(
                "input '{}': shape has a negative dimension",
                t.name
            )));
        }
        let data: Bytes = match req.raw_input_contents.get(i) {
            Some(raw) => raw.clone(),
            None => {
                let c = t.contents.unwrap_or_default();
                contents_to_bytes(&t.name, dt, &c)?.into()
            }
        };
        inputs.push(Tensor::new(t.name, dt, t.shape, data)?);
    }
    let mut outputs = Vec::with_capacity(req.outputs.len());
    for o in req.outputs {
        let classification = match o.parameters.get("classification").map(param_to_json) {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|&n| n > 0 && n <= MAX_CLASSIFICATION)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "output '{}': 'classification' must be an integer in 1..={MAX_CLASSIFICATION}",
                            o.name
                        ))
                    })? as usize,
            ),
        };
        outputs.push(OutputSpec {
            name: o.name,
            binary: None,
            classification,
        });
    }
    let request = InferRequest {
        id: req.id,
        inputs,
        requested_outputs: outputs.iter().map(|o| o.name.clone()).collect(),
        parameters: req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), param_to_json(v)))
            .collect(),
    };
    Ok(Decoded {
        request,
        outputs,
        binary_default: false,
    })
}

async fn infer(
    service: &Service,
    mut req: pb::ModelInferRequest,
) -> Result<pb::ModelInferResponse, Error> {
    let received = std::time::Instant::now();
    let version = (!req.model_version.is_empty()).then(|| std::mem::take(&mut req.model_version));
    let m = service.model(&req.model_name, version.as_deref())?;
    let decoded = decode(req);
    let answer = service.infer(m, decoded, received).await?;
    let mut resp = pb::ModelInferResponse {
        model_name: answer.model.name.clone(),
        model_version: answer.model.version.to_string(),
        id: answer.id,
        ..Default::default()
    };
    for (_, t) in answer.outputs {
        resp.outputs
            .push(pb::model_infer_response::InferOutputTensor {
                name: t.name,
                datatype: t.datatype.as_str().to_string(),
                shape: t.shape,
                ..Default::default()
            });
        resp.raw_output_contents.push(t.data);
    }
    Ok(resp)
}

fn stat(d: Duration) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

fn tensor_metadata(t: TensorMetadata) -> pb::model_metadata_response::TensorMetadata {
    pb::model_metadata_response::TensorMetadata {
        name: t.name,
        datatype: t.datatype.to_string(),
        shape: t.shape,
    }
}

fn version_of(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for GrpcService {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.service.server_ready(),
        }))
    }

    async fn model_ready(
        &self,
        r: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = r.into_inner();
        let ready = self
            .service
            .model_ready(&r.name, version_of(&r.version))
            .map_err(status)?;
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        let m = self.service.server_metadata();
        Ok(Response::new(pb::ServerMetadataResponse {
            name: m.name.into(),
            version: m.version.into(),
            extensions: m.extensions.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        r: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = r.into_inner();
        let m = self
            .service
            .model_metadata(&r.name, version_of(&r.version))
            .map_err(status)?;
        Ok(Response::new(pb::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(tensor_metadata).collect(),
            outputs: m.outputs.into_iter().map(tensor_metadata).collect(),
        }))
    }

    async fn model_infer(
        &self,
        r: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        infer(&self.service, r.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }

    type ModelStreamInferStream = ResponseStream;

    async fn model_stream_infer(
        &self,
        r: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let mut inbound = r.into_inner();
        let service = self.service.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // At most this many requests of the stream are in flight, counting responses the client
        // has not read yet: past it the next message is not read, so a client that does not read
        // its responses is slowed down by HTTP/2 flow control instead of buffered without limit.
        let in_flight = Arc::new(tokio::sync::Semaphore::new(self.stream_in_flight));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let Some(next) = inbound.next().await else {
                    break;
                };
                let Ok(req) = next else { break };
                let (service, tx) = (service.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let id = req.id.clone();
                    let msg = match infer(&service, req).await {
                        Ok(resp) => pb::ModelStreamInferResponse {
                            error_message: String::new(),
                            infer_response: Some(resp),
                        },
                        Err(e) => pb::ModelStreamInferResponse {
                            error_message: e.message().to_string(),
                            infer_response: Some(pb::ModelInferResponse {
                                id,
                                ..Default::default()
                            }),
                        },
                    };
                    let _ = tx.send(Ok(msg)).await;
                });
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn model_config(
        &self,
        r: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        use prost::Message;
        let r = r.into_inner();
        let cfg = self
            .service
            .model_config(&r.name, version_of(&r.version))
            .map_err(status)?;
        let bytes = wisp_core::config::config_to_protobuf(&cfg);
        let config = pb::ModelConfig::decode(bytes.as_slice())
            .map_err(|e| status(Error::internal(format!("config encoding: {e}"))))?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_statistics(
        &self,
        r: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = r.into_inner();
        let model = (!r.name.is_empty()).then_some(r.name.as_str());
        let version = model.and(version_of(&r.version));
        let stats = self.service.statistics(model, version).map_err(status)?;
        let model_stats = stats
            .into_iter()
            .map(|s| pb::ModelStatistics {
                name: s.name,
                version: s.version.to_string(),
                last_inference: s.last_inference,
                inference_count: s.inference_count,
                execution_count: s.execution_count,
                inference_stats: Some(pb::InferStatistics {
                    success: stat(s.success),
                    fail: stat(s.fail),
                    queue: stat(s.queue),
                    compute_input: stat(s.compute_input),
                    compute_infer: stat(s.compute_infer),
                    compute_output: stat(s.compute_output),
                    cache_hit: stat(s.cache_hit),
                    cache_miss: stat(s.cache_miss),
                }),
                batch_stats: s
                    .batches
                    .iter()
                    .map(|b| pb::InferBatchStatistics {
                        batch_size: b.batch_size,
                        compute_input: stat(Duration {
                            count: b.count,
                            ns: b.input_ns,
                        }),
                        compute_infer: stat(Duration {
                            count: b.count,
                            ns: b.infer_ns,
                        }),
                        compute_output: stat(Duration {
                            count: b.count,
                            ns: b.output_ns,
                        }),
                    })
                    .collect(),
                memory_usage: Vec::new(),
            })
            .collect();
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        r: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let rows = self.service.index(r.into_inner().ready).map_err(status)?;
        Ok(Response::new(pb::RepositoryIndexResponse {
            models: rows
                .into_iter()
                .map(|r| pb::repository_index_response::ModelIndex {
                    name: r.name,
                    version: r.version.map(|v| v.to_string()).unwrap_or_default(),
                    state: r.state.to_string(),
                    reason: r.reason,
                })
                .collect(),
        }))
    }

    async fn repository_model_load(
        &self,
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
        let load = LoadRequest {
            repository: r.repository_name,
            config,
            has_files: r.parameters.keys().any(|k| k.starts_with("file:")),
        };
        self.service
            .load(&r.model_name, load)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        r: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let r = r.into_inner();
        self.service
            .unload(&r.model_name, &r.repository_name)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn log_settings(
        &self,
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
        let s = self.service.log_settings(&update).map_err(status)?;
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
}
