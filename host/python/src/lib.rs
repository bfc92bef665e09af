//! `wisp._wisp`: the extension module under `import wisp`. It holds an
//! [`Embedded`] Wisp and its tokio runtime, and moves tensors as
//! `(name, datatype, shape, bytes)` tuples; the `wisp` package (`python/wisp/__init__.py`)
//! turns those into numpy arrays. Every call that waits on models releases the GIL.

use std::sync::RwLock;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use wisp_backend_onnx::EngineChoice;
use wisp_core::{DataType, ErrorKind, InferRequest, Tensor};
use wisp_service::core::CoreOptions;
use wisp_service::embed::Embedded;
use wisp_service::ControlMode;

create_exception!(wisp, WispError, PyException, "An error from Wisp.");
create_exception!(
    wisp,
    InvalidArgumentError,
    WispError,
    "A bad request or config."
);
create_exception!(wisp, NotFoundError, WispError, "No such model or version.");
create_exception!(
    wisp,
    UnavailableError,
    WispError,
    "Not ready, or not allowed now."
);
create_exception!(
    wisp,
    UnsupportedError,
    WispError,
    "Not something Wisp does."
);
create_exception!(wisp, AlreadyExistsError, WispError, "Already there.");
create_exception!(
    wisp,
    InternalError,
    WispError,
    "A failure inside Wisp or a model."
);
create_exception!(
    wisp,
    ResourceExhaustedError,
    WispError,
    "Too large, or out of budget."
);

/// The Python exception for a Wisp error: one class per kind, as Triton's in-process API has.
fn py_err(e: wisp_core::Error) -> PyErr {
    let msg = e.message().to_string();
    match e.kind() {
        ErrorKind::InvalidArg => InvalidArgumentError::new_err(msg),
        ErrorKind::NotFound => NotFoundError::new_err(msg),
        // Forbidden is a network front end's refusal; in-process calls never get it.
        ErrorKind::Unavailable | ErrorKind::Forbidden => UnavailableError::new_err(msg),
        ErrorKind::Unsupported => UnsupportedError::new_err(msg),
        ErrorKind::AlreadyExists => AlreadyExistsError::new_err(msg),
        ErrorKind::Internal => InternalError::new_err(msg),
        ErrorKind::TooLarge | ErrorKind::Exhausted => ResourceExhaustedError::new_err(msg),
    }
}

/// A tensor as it crosses into Python: name, KServe datatype (`FP32`), shape, raw bytes
/// (BYTES: Triton's length-prefixed elements).
type PyTensor<'py> = (String, &'static str, Vec<i64>, Bound<'py, PyBytes>);

/// One repository index row: name, version, state, reason.
type IndexRow = (String, Option<u64>, &'static str, String);

/// A tensor's metadata: name, datatype, shape.
type TensorRow = (String, String, Vec<i64>);

/// Wisp running in this process.
#[pyclass(frozen, module = "wisp._wisp")]
struct Server {
    runtime: tokio::runtime::Runtime,
    /// `None` after `shutdown`. Calls hold the read lock while they run, so `shutdown` waits
    /// for them.
    wisp: RwLock<Option<Embedded>>,
}

impl Server {
    /// Runs `f` on the embedded Wisp with the GIL released.
    fn with<'py, T: Send>(
        &self,
        py: Python<'py>,
        f: impl FnOnce(&Embedded, &tokio::runtime::Runtime) -> wisp_core::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let guard = self.wisp.read().unwrap_or_else(|p| p.into_inner());
            let wisp = guard
                .as_ref()
                .ok_or_else(|| wisp_core::Error::unavailable("the server was shut down"))?;
            f(wisp, &self.runtime)
        })
        .map_err(py_err)
    }
}

#[pymethods]
impl Server {
    /// Loads `model_repository` (a path, or a list of them) and starts serving in-process.
    /// `model_control_mode` is `none`, `poll` or `explicit` (then only `load_model` load at
    /// start); `onnx_engine` is `auto`, `onnxruntime` or `tract`.
    #[new]
    #[pyo3(signature = (model_repository, *, model_control_mode = "none", load_model = Vec::new(),
        onnx_engine = "auto", strict_readiness = true, exit_on_error = false,
        repository_poll_secs = 15))]
    #[expect(
        clippy::too_many_arguments,
        reason = "Python keyword arguments, mirroring wisp serve's flags"
    )]
    fn new(
        py: Python<'_>,
        model_repository: Bound<'_, PyAny>,
        model_control_mode: &str,
        load_model: Vec<String>,
        onnx_engine: &str,
        strict_readiness: bool,
        exit_on_error: bool,
        repository_poll_secs: u64,
    ) -> PyResult<Self> {
        let repos: Vec<String> = match model_repository.extract::<String>() {
            Ok(one) => vec![one],
            Err(_) => model_repository.extract()?,
        };
        let bad = |what: &str, v: &str, want: &str| {
            InvalidArgumentError::new_err(format!("{what}: '{v}' is not one of {want}"))
        };
        let mut s = CoreOptions::for_repositories(repos.into_iter().map(Into::into).collect());
        s.control_mode = match model_control_mode {
            "none" => ControlMode::None,
            "poll" => ControlMode::Poll,
            "explicit" => ControlMode::Explicit,
            v => return Err(bad("model_control_mode", v, "none, poll, explicit")),
        };
        s.onnx_engine = match onnx_engine {
            "auto" => EngineChoice::Auto,
            "onnxruntime" => EngineChoice::OnnxRuntime,
            "tract" => EngineChoice::Tract,
            v => return Err(bad("onnx_engine", v, "auto, onnxruntime, tract")),
        };
        s.load_model = load_model;
        s.strict_readiness = strict_readiness;
        s.exit_on_error = exit_on_error;
        s.poll_every = std::time::Duration::from_secs(repository_poll_secs);
        py.detach(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("wisp-py")
                .enable_all()
                .build()
                .map_err(|e| WispError::new_err(format!("cannot start a runtime: {e}")))?;
            let wisp = runtime
                .block_on(Embedded::open(s))
                .map_err(|e| WispError::new_err(e.message().to_string()))?;
            Ok(Server {
                runtime,
                wisp: RwLock::new(Some(wisp)),
            })
        })
    }

    /// Runs `inputs` (`(name, datatype, shape, bytes)` tuples) through `model` and returns its
    /// outputs the same way: `outputs` named (in that order) or all of them (config order).
    #[pyo3(signature = (model, inputs, version = None, outputs = Vec::new(), parameters = None))]
    fn infer<'py>(
        &self,
        py: Python<'py>,
        model: &str,
        inputs: Vec<(String, String, Vec<i64>, Vec<u8>)>,
        version: Option<String>,
        outputs: Vec<String>,
        parameters: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Vec<PyTensor<'py>>> {
        let mut request = InferRequest {
            requested_outputs: outputs,
            ..Default::default()
        };
        for (name, datatype, shape, data) in inputs {
            let dt = DataType::parse(&datatype)
                .map_err(|e| py_err(e.context(format!("input '{name}'"))))?;
            let t = Tensor::new(name, dt, shape, data.into()).map_err(py_err)?;
            request.inputs.push(t);
        }
        if let Some(params) = parameters {
            for (k, v) in params.iter() {
                let key: String = k.extract()?;
                let value = if let Ok(b) = v.extract::<bool>() {
                    serde_json::Value::Bool(b)
                } else if let Ok(i) = v.extract::<i64>() {
                    serde_json::Value::from(i)
                } else if let Ok(s) = v.extract::<String>() {
                    serde_json::Value::String(s)
                } else {
                    return Err(InvalidArgumentError::new_err(format!(
                        "parameter '{key}': must be a bool, an int or a str"
                    )));
                };
                request.parameters.insert(key, value);
            }
        }
        let out = self.with(py, |wisp, rt| {
            rt.block_on(wisp.infer_request(model, version.as_deref(), request))
        })?;
        Ok(out
            .into_iter()
            .map(|t| {
                let data = PyBytes::new(py, &t.data);
                (t.name, t.datatype.as_str(), t.shape, data)
            })
            .collect())
    }

    /// Loads or reloads `model`; `config` (Triton's JSON `ModelConfig`) replaces its
    /// `config.pbtxt`. Explicit control mode only.
    #[pyo3(signature = (model, config = None))]
    fn load(&self, py: Python<'_>, model: &str, config: Option<String>) -> PyResult<()> {
        self.with(py, |wisp, rt| match &config {
            Some(c) => rt.block_on(wisp.load_with_config(model, c)),
            None => rt.block_on(wisp.load(model)),
        })
    }

    /// Unloads `model`. Explicit control mode only.
    fn unload(&self, py: Python<'_>, model: &str) -> PyResult<()> {
        self.with(py, |wisp, rt| rt.block_on(wisp.unload(model)))
    }

    /// The repository index: `(name, version or None, state, reason)` per model and version.
    fn models(&self, py: Python<'_>) -> PyResult<Vec<IndexRow>> {
        let rows = self.with(py, |wisp, _| wisp.models())?;
        Ok(rows
            .into_iter()
            .map(|r| (r.name, r.version, r.state, r.reason))
            .collect())
    }

    /// Whether `model` (a `version` of it, if given) is ready.
    #[pyo3(signature = (model, version = None))]
    fn model_ready(&self, py: Python<'_>, model: &str, version: Option<String>) -> PyResult<bool> {
        self.with(
            py,
            |wisp, _| Ok(wisp.model_ready(model, version.as_deref())),
        )
    }

    /// A model's inputs and outputs: `(inputs, outputs)`, each a list of
    /// `(name, datatype, shape)` (`-1`: any size, the first one the batch).
    #[pyo3(signature = (model, version = None))]
    fn metadata(
        &self,
        py: Python<'_>,
        model: &str,
        version: Option<String>,
    ) -> PyResult<(Vec<TensorRow>, Vec<TensorRow>)> {
        let m = self.with(py, |wisp, _| wisp.metadata(model, version.as_deref()))?;
        let rows = |ts: Vec<wisp_service::query::TensorMetadata>| {
            ts.into_iter()
                .map(|t| (t.name, t.datatype.to_string(), t.shape))
                .collect()
        };
        Ok((rows(m.inputs), rows(m.outputs)))
    }

    /// Lets running requests finish, drains every model and stops. Later calls raise
    /// `UnavailableError`.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let taken = self.wisp.write().unwrap_or_else(|p| p.into_inner()).take();
            match taken {
                Some(wisp) => self
                    .runtime
                    .block_on(wisp.shutdown())
                    .map_err(|e| WispError::new_err(format!("{e:#}"))),
                None => Ok(()),
            }
        })
    }
}

#[pymodule]
fn _wisp(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Server>()?;
    m.add("WispError", py.get_type::<WispError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("UnavailableError", py.get_type::<UnavailableError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("AlreadyExistsError", py.get_type::<AlreadyExistsError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add(
        "ResourceExhaustedError",
        py.get_type::<ResourceExhaustedError>(),
    )?;
    Ok(())
}
