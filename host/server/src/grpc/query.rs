//! Health, metadata, config, statistics and the repository index.

use super::*;

pub(super) fn stat(d: Duration) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

pub(super) fn tensor_metadata(t: TensorMetadata) -> pb::model_metadata_response::TensorMetadata {
    pb::model_metadata_response::TensorMetadata {
        name: t.name,
        datatype: t.datatype.to_string(),
        shape: t.shape,
    }
}

pub(super) fn version_of(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

pub(super) async fn server_live(
    _svc: &GrpcService,
    _: Request<pb::ServerLiveRequest>,
) -> Result<Response<pb::ServerLiveResponse>, Status> {
    Ok(Response::new(pb::ServerLiveResponse { live: true }))
}

pub(super) async fn server_ready(
    svc: &GrpcService,
    _: Request<pb::ServerReadyRequest>,
) -> Result<Response<pb::ServerReadyResponse>, Status> {
    Ok(Response::new(pb::ServerReadyResponse {
        ready: svc.service.server_ready(),
    }))
}

pub(super) async fn model_ready(
    svc: &GrpcService,
    r: Request<pb::ModelReadyRequest>,
) -> Result<Response<pb::ModelReadyResponse>, Status> {
    let r = r.into_inner();
    // Unknown, unloaded and not-ready models are `ready: false` with OK, as in Triton.
    let ready = svc
        .service
        .model_ready(&r.name, version_of(&r.version))
        .map_err(status)?
        .is_ok();
    Ok(Response::new(pb::ModelReadyResponse { ready }))
}

pub(super) async fn server_metadata(
    svc: &GrpcService,
    _: Request<pb::ServerMetadataRequest>,
) -> Result<Response<pb::ServerMetadataResponse>, Status> {
    let m = svc.service.server_metadata();
    Ok(Response::new(pb::ServerMetadataResponse {
        name: m.name.into(),
        version: m.version.into(),
        extensions: m.extensions.iter().map(|s| s.to_string()).collect(),
    }))
}

pub(super) async fn model_metadata(
    svc: &GrpcService,
    r: Request<pb::ModelMetadataRequest>,
) -> Result<Response<pb::ModelMetadataResponse>, Status> {
    let r = r.into_inner();
    let m = svc
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

pub(super) async fn model_config(
    svc: &GrpcService,
    r: Request<pb::ModelConfigRequest>,
) -> Result<Response<pb::ModelConfigResponse>, Status> {
    use prost::Message;
    let r = r.into_inner();
    let cfg = svc
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

pub(super) async fn model_statistics(
    svc: &GrpcService,
    r: Request<pb::ModelStatisticsRequest>,
) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
    let r = r.into_inner();
    let model = (!r.name.is_empty()).then_some(r.name.as_str());
    let version = model.and(version_of(&r.version));
    let stats = svc.service.statistics(model, version).map_err(status)?;
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

pub(super) async fn repository_index(
    svc: &GrpcService,
    r: Request<pb::RepositoryIndexRequest>,
) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
    let rows = svc.service.index(r.into_inner().ready).map_err(status)?;
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
