//! System shared memory registration and status; CUDA shared memory answers UNIMPLEMENTED.

use super::*;
use crate::service::shm::cuda_unsupported;

pub(super) async fn system_shared_memory_status(
    svc: &GrpcService,
    r: Request<pb::SystemSharedMemoryStatusRequest>,
) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
    let scope = shm_scope(r.metadata()).map_err(status)?;
    let name = r.into_inner().name;
    let rows = svc
        .service
        .shm()
        .status(&scope, (!name.is_empty()).then_some(name.as_str()))
        .map_err(status)?;
    let regions = rows
        .into_iter()
        .map(|s| {
            let row = pb::system_shared_memory_status_response::RegionStatus {
                name: s.name.clone(),
                key: s.key,
                offset: s.offset as u64,
                byte_size: s.byte_size as u64,
            };
            (s.name, row)
        })
        .collect();
    Ok(Response::new(pb::SystemSharedMemoryStatusResponse {
        regions,
    }))
}

pub(super) async fn system_shared_memory_register(
    svc: &GrpcService,
    r: Request<pb::SystemSharedMemoryRegisterRequest>,
) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
    let scope = shm_scope(r.metadata()).map_err(status)?;
    let r = r.into_inner();
    let size = |n: u64, what: &str| {
        usize::try_from(n).map_err(|_| status(Error::invalid(format!("{what} {n} is too large"))))
    };
    let (offset, byte_size) = (size(r.offset, "offset")?, size(r.byte_size, "byte_size")?);
    svc.service
        .clone()
        .register_shm(scope, r.name, r.key, offset, byte_size)
        .await
        .map_err(status)?;
    Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
}

pub(super) async fn system_shared_memory_unregister(
    svc: &GrpcService,
    r: Request<pb::SystemSharedMemoryUnregisterRequest>,
) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
    let scope = shm_scope(r.metadata()).map_err(status)?;
    let name = r.into_inner().name;
    svc.service
        .shm()
        .unregister(&scope, (!name.is_empty()).then_some(name.as_str()));
    Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
}

pub(super) async fn cuda_shared_memory_status(
    _svc: &GrpcService,
    _: Request<pb::CudaSharedMemoryStatusRequest>,
) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
    Err(status(cuda_unsupported()))
}

pub(super) async fn cuda_shared_memory_register(
    _svc: &GrpcService,
    _: Request<pb::CudaSharedMemoryRegisterRequest>,
) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
    Err(status(cuda_unsupported()))
}

pub(super) async fn cuda_shared_memory_unregister(
    _svc: &GrpcService,
    _: Request<pb::CudaSharedMemoryUnregisterRequest>,
) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
    Err(status(cuda_unsupported()))
}
