//! `wisp-core`: the vocabulary every Wisp crate shares, with no heavy dependencies.
//!
//! - [`datatype`] and [`tensor`]: KServe v2 datatypes and zero-copy tensors.
//! - [`infer`]: protocol-neutral requests and responses (what front ends decode into).
//! - [`config`]: `config.pbtxt` parse → auto-complete → normalize → validate.
//! - [`repository`]: Triton-layout repository scanning and version policies.
//! - [`backend`]: the `Backend` / `LoadedModel` / `Instance` traits backends implement.
//! - [`env`](mod@env): the one injectable source of environment variables.
//! - [`meminfo`]: `/proc/meminfo` fields.
//! - [`trace`]: request traces (the trace extension) the scheduler and ensembles mark.
//! - [`error`]: the closed [`error::ErrorKind`] front ends map to statuses.
//!
//! A request flows: front end decodes → [`infer::InferRequest`] → scheduler → an
//! [`backend::Instance`] executes a batch → [`infer::InferResponse`] → front end encodes.

pub mod backend;
pub mod config;
pub mod datatype;
pub mod env;
pub mod error;
pub mod infer;
pub mod meminfo;
pub mod repository;
pub mod tensor;
pub mod trace;

pub use datatype::DataType;
pub use error::{Error, ErrorKind, Result};
pub use infer::{InferRequest, InferResponse, Parameters};
pub use tensor::Tensor;
