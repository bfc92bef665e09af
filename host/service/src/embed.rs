//! Wisp in-process: the models and the service layer of the server, called from Rust with no
//! sockets. It is what Triton's in-process C API (and its `tritonserver` Python package) is to
//! Triton: the same repository, configs, schedulers, plugins and statistics, without a protocol
//! in between.
//!
//! ```no_run
//! # async fn demo() -> wisp_core::Result<()> {
//! use wisp_service::core::CoreOptions;
//! use wisp_service::embed::Embedded;
//! use wisp_core::Tensor;
//!
//! let wisp = Embedded::open(CoreOptions::for_repositories(vec!["model_repo".into()])).await?;
//! let a = Tensor::from_values("INPUT0", vec![1, 16], &[1.0f32; 16])?;
//! let b = Tensor::from_values("INPUT1", vec![1, 16], &[2.0f32; 16])?;
//! let outputs = wisp.infer("add_sub", None, vec![a, b]).await?;
//! assert_eq!(outputs[0].values::<f32>()?, vec![3.0; 16]);
//! wisp.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Requests go through [`Service::infer`], so they are validated, batched with each other,
//! cached and counted exactly as a network request would be; errors are [`wisp_core::Error`]s
//! whose [`ErrorKind`](wisp_core::ErrorKind) is what the front ends map to a status. Load and
//! unload follow the server's policy: they need `model_control_mode` `explicit`, as in Triton.
//! `wisp_server::embed::open` opens one from `wisp serve`'s settings instead.

use std::sync::Arc;
use std::time::Instant;

use wisp_core::{InferRequest, Result, Tensor};

use crate::control::{Caller, LoadRequest};
use crate::core::{Core, CoreOptions};
use crate::models::IndexEntry;
use crate::query::ModelMetadata;
use crate::{Decoded, OutputSpec, Service};

/// A Wisp running inside this process. Must be opened and used inside a tokio runtime.
pub struct Embedded {
    core: Option<Core>,
}

impl Embedded {
    /// Loads the repository's models and starts the repository poller (poll mode) and the SLA
    /// watch.
    pub async fn open(options: CoreOptions) -> Result<Embedded> {
        Ok(Embedded::from_core(Core::open(options).await?))
    }

    /// In-process calls on a core opened already.
    pub fn from_core(core: Core) -> Embedded {
        Embedded { core: Some(core) }
    }

    fn core(&self) -> &Core {
        self.core.as_ref().expect("the core lives until shutdown")
    }

    /// The service layer itself, for what the methods below do not cover (statistics, trace
    /// and log settings, shared memory).
    pub fn service(&self) -> &Arc<Service> {
        self.core().service()
    }

    /// Runs `inputs` through `model` (`version`: `None` for the version policy's latest) and
    /// returns every output, in config order.
    pub async fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        inputs: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        let request = InferRequest {
            inputs,
            ..Default::default()
        };
        self.infer_request(model, version, request).await
    }

    /// Runs a full request: its `id`, its `parameters` (`priority`, `timeout`, `sequence_id`,
    /// …) and its `requested_outputs` (empty: all, in config order; otherwise those, in that
    /// order).
    pub async fn infer_request(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
    ) -> Result<Vec<Tensor>> {
        let received = Instant::now();
        let service = self.core().service();
        let m = service.model(model, version)?;
        let outputs = request
            .requested_outputs
            .iter()
            .map(|name| OutputSpec {
                name: name.clone(),
                ..Default::default()
            })
            .collect();
        let decoded = Decoded {
            request,
            outputs,
            binary_default: false,
            shm_inputs: Vec::new(),
            shm_scope: Default::default(),
        };
        let answer = service.infer(m, Ok(decoded), received, None).await?;
        Ok(answer.outputs.into_iter().map(|(_, t)| t).collect())
    }

    /// Loads or reloads `model` from the repository (explicit control mode only).
    pub async fn load(&self, model: &str) -> Result<()> {
        self.core()
            .service()
            .load(model, LoadRequest::plain(Caller::InProcess))
            .await
    }

    /// Loads `model` with `config` (Triton's JSON `ModelConfig`) in place of its
    /// `config.pbtxt` (explicit control mode only).
    pub async fn load_with_config(&self, model: &str, config: &str) -> Result<()> {
        let req = LoadRequest {
            config: Some(config.to_string()),
            ..LoadRequest::plain(Caller::InProcess)
        };
        self.core().service().load(model, req).await
    }

    /// Unloads `model`; requests already running finish (explicit control mode only).
    pub async fn unload(&self, model: &str) -> Result<()> {
        self.core()
            .service()
            .unload(model, "", false, Caller::InProcess)
            .await
    }

    /// The repository index: every model and version with its state and, when it is not
    /// ready (or its last reload failed), why.
    pub fn models(&self) -> Result<Vec<IndexEntry>> {
        self.core().service().index(false)
    }

    /// A model's inputs and outputs (KServe model metadata).
    pub fn metadata(&self, model: &str, version: Option<&str>) -> Result<ModelMetadata> {
        self.core().service().model_metadata(model, version)
    }

    /// Whether `model` (`version`: `None` for any) is ready to serve.
    pub fn model_ready(&self, model: &str, version: Option<&str>) -> bool {
        matches!(
            self.core().service().model_ready(model, version),
            Ok(Ok(()))
        )
    }

    /// Stops the poller and the SLA watch, lets running requests finish, drains every model
    /// and writes the last traces.
    pub async fn shutdown(mut self) -> Result<()> {
        match self.core.take() {
            Some(core) => core.close().await,
            None => Ok(()),
        }
    }
}

impl Drop for Embedded {
    /// Dropped without [`Embedded::shutdown`]: the background tasks stop; models drain when the
    /// last request holding them ends.
    fn drop(&mut self) {
        if let Some(core) = &self.core {
            core.stop_tasks();
        }
    }
}
