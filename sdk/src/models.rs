//! Calling the server's other models with full requests (`wisp:plugin/models`, Triton's
//! "business logic scripting").
//!
//! ```no_run
//! # use wisp_sdk::{models::Model, Request, Tensor, Error};
//! # fn f() -> Result<(), Error> {
//! let tokenizer = Model::new("tokenizer")?; // or "tokenizer:2" for version 2
//! let request = Request::new(vec![Tensor::from_strings("TEXT", vec![1], &["hello"])]);
//! let response = tokenizer.infer(&request)?;
//! # Ok(()) }
//! ```
//!
//! Unlike `wasi:nn` ([`crate::nn`]), a call carries every datatype (BYTES and BOOL included),
//! parameters and requested outputs, and may go to an ensemble or another plugin.
//! [`Model::infer_batch`] sends a whole list at once: it reaches the called model's scheduler
//! together, so a plugin serving a batch makes one batched call instead of one per request.
//! The model is looked up at each call, so a plugin never depends on which model loaded
//! first. A call back into a model already on the call's path (the plugin itself, or a model
//! that called it) fails with `invalid-argument` instead of waiting on itself.
//!
//! Outside the server (native unit tests) calls go to the closures registered with
//! [`crate::testing::serve`].

use crate::{Error, Request, Response, Tensor};

/// A model the plugin calls: a name and an optional version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    name: String,
    version: Option<u64>,
}

impl Model {
    /// `"model"` (the version the model's policy serves) or `"model:version"`.
    pub fn new(spec: &str) -> Result<Model, Error> {
        let (name, version) = match spec.rsplit_once(':') {
            Some((name, v)) => {
                let v = v.parse::<u64>().map_err(|_| {
                    Error::invalid(format!("model '{spec}': the version must be a number"))
                })?;
                (name, Some(v))
            }
            None => (spec, None),
        };
        if name.is_empty() {
            return Err(Error::invalid(format!("model '{spec}': no name")));
        }
        Ok(Model {
            name: name.to_string(),
            version,
        })
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version asked for (`None`: what the model's policy serves).
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Runs `batch` on the model, all at once: one result per request, in order. The outer
    /// error is for the call as a whole (unknown or unready model, a call cycle, the deadline).
    pub fn infer_batch(&self, batch: &[Request]) -> Result<Vec<Result<Response, Error>>, Error> {
        #[cfg(target_family = "wasm")]
        {
            crate::bindings::wisp::plugin::models::infer(&self.name, self.version, batch)
        }
        #[cfg(not(target_family = "wasm"))]
        {
            crate::testing::call(&self.name, batch)
        }
    }

    /// Runs one request.
    pub fn infer(&self, request: &Request) -> Result<Response, Error> {
        self.infer_batch(std::slice::from_ref(request))?
            .pop()
            .unwrap_or_else(|| Err(Error::internal("the host returned no result")))
    }

    /// Runs one request made of `inputs` (all outputs, no parameters).
    pub fn infer_inputs(&self, inputs: Vec<Tensor>) -> Result<Response, Error> {
        self.infer(&Request::new(inputs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let m = Model::new("tok:3").unwrap();
        assert_eq!((m.name(), m.version()), ("tok", Some(3)));
        assert_eq!(Model::new("tok").unwrap().version(), None);
        assert!(Model::new("tok:x").is_err());
        assert!(Model::new(":1").is_err());
    }
}
