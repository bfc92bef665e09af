//! How a plugin's wasi-nn calls and an ensemble's steps reach the server's other models: through
//! the registry, validated and counted as a front end's requests are.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use wisp_core::backend::ModelCaller;
use wisp_core::config::Signature;
use wisp_core::infer::{Scheduling, SequenceFlags};
use wisp_core::trace::Trace;
use wisp_core::{Error, InferRequest, InferResponse, Result};

use super::{ModelVersion, Registry};

/// Validates a plugin's or an ensemble step's request against the model it calls; a failure
/// counts in that model's statistics, as it would over HTTP or gRPC.
fn validate(m: &ModelVersion, request: &InferRequest) -> Result<()> {
    wisp_core::infer::validate(request, &m.signature).inspect_err(|_| {
        m.stats()
            .record_failure(wisp_scheduler::FailReason::Other, std::time::Duration::ZERO);
    })
}

/// Resolves plugin wasi-nn calls against the registry (set once the registry exists).
#[derive(Default)]
pub struct RegistryCaller {
    registry: OnceLock<Weak<Registry>>,
}

impl RegistryCaller {
    /// Points the caller at `registry` (later calls are ignored).
    pub fn attach(&self, registry: &Arc<Registry>) {
        let _ = self.registry.set(Arc::downgrade(registry));
    }

    fn registry(&self) -> Result<Arc<Registry>> {
        self.registry
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::unavailable("the server is shutting down"))
    }

    /// A served, ready model version that takes one response per request: a decoupled model
    /// answers on a client's stream, which an ensemble step or a plugin's call does not have.
    fn callable(&self, model: &str, version: Option<&str>) -> Result<Arc<ModelVersion>> {
        let m = self.registry()?.get(model, version)?;
        if m.config.decoupled() {
            return Err(Error::unsupported(format!(
                "model '{}' is decoupled (it streams its responses to a client): an ensemble step or a plugin cannot call it",
                m.name
            )));
        }
        Ok(m)
    }
}

impl RegistryCaller {
    /// The signature of a served, ready model.
    pub fn signature(&self, model: &str, version: Option<&str>) -> Result<Arc<Signature>> {
        Ok(self.registry()?.get(model, version)?.signature.clone())
    }

    /// A served, ready model version.
    pub fn version(&self, model: &str, version: Option<&str>) -> Result<Arc<ModelVersion>> {
        self.registry()?.get(model, version)
    }

    /// Queues `request` on `model` (validated against its signature); `respond` gets the
    /// outcome. A traced request (an ensemble step's) runs as a child trace of the caller's.
    pub fn submit(
        &self,
        model: &str,
        version: Option<&str>,
        mut request: InferRequest,
        respond: wisp_scheduler::Responder,
    ) -> Result<()> {
        let m = self.callable(model, version)?;
        validate(&m, &request)?;
        match start_child(&m, &mut request) {
            None => m.submit(request, respond),
            Some(child) => m.submit(
                request,
                Box::new(move |r| {
                    child.mark("REQUEST_END");
                    respond(r)
                }),
            ),
        }
    }
}

/// How an ensemble reaches its composing models: the registry ([`RegistryCaller`]) when
/// served, a fake in tests.
pub trait StepCaller: Send + Sync {
    /// The signature of a served, ready model.
    fn signature(&self, model: &str, version: Option<&str>) -> Result<Arc<Signature>>;
    /// The labels of `model`'s `output` as loaded now, when it has any.
    fn labels(&self, model: &str, version: Option<&str>, output: &str) -> Option<Arc<Vec<String>>>;
    /// Queues `request` on `model`; `respond` gets the outcome. An error is the request's
    /// refusal (the model is not served, or the request does not fit it): `respond` is not
    /// called then.
    fn submit(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        respond: wisp_scheduler::Responder,
    ) -> Result<()>;
}

impl StepCaller for RegistryCaller {
    fn signature(&self, model: &str, version: Option<&str>) -> Result<Arc<Signature>> {
        RegistryCaller::signature(self, model, version)
    }

    fn labels(&self, model: &str, version: Option<&str>, output: &str) -> Option<Arc<Vec<String>>> {
        self.version(model, version)
            .ok()?
            .labels
            .get(output)
            .cloned()
    }

    fn submit(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
        respond: wisp_scheduler::Responder,
    ) -> Result<()> {
        RegistryCaller::submit(self, model, version, request, respond)
    }
}

/// A traced call's child trace, started, for the version that serves it (`request.trace`
/// holds the caller's trace).
fn start_child(m: &ModelVersion, request: &mut InferRequest) -> Option<Arc<Trace>> {
    let child = request
        .trace
        .take()
        .map(|parent| parent.child(&m.name, Some(m.version)));
    if let Some(c) = &child {
        c.mark("REQUEST_START");
    }
    request.trace = child.clone();
    child
}

impl ModelCaller for RegistryCaller {
    fn check(&self, model: &str, version: Option<&str>) -> Result<()> {
        self.callable(model, version).map(|_| ())
    }

    fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        mut request: InferRequest,
        deadline: Instant,
    ) -> Result<InferResponse> {
        let m = self.callable(model, version)?;
        validate(&m, &request)?;
        // A traced plugin request's call is a child trace, as an ensemble step is.
        let child = start_child(&m, &mut request);
        let result = m.infer_blocking(request, deadline);
        if let Some(c) = &child {
            c.mark("REQUEST_END");
        }
        result
    }

    fn infer_batch(
        &self,
        model: &str,
        version: Option<&str>,
        requests: Vec<InferRequest>,
        deadline: Instant,
    ) -> Result<Vec<Result<InferResponse>>> {
        let m = self.callable(model, version)?;
        let mut children = Vec::with_capacity(requests.len());
        let checked = requests
            .into_iter()
            .map(|mut request| {
                validate(&m, &request)?;
                request.scheduling = Scheduling::from_parameters(&request.parameters)?;
                request.sequence = SequenceFlags::from_parameters(&request.parameters)?;
                children.extend(start_child(&m, &mut request));
                Ok(request)
            })
            .collect();
        let results = m.infer_many_blocking(checked, deadline);
        for c in children {
            c.mark("REQUEST_END");
        }
        Ok(results)
    }
}
