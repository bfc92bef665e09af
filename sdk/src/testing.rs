//! A native test double for model calls: register what a called model answers, then unit-test
//! a plugin that calls it with plain `cargo test`.
//!
//! ```
//! use wisp_sdk::{models::Model, testing, Request, Response, Tensor};
//!
//! testing::serve("double", |r: &Request| {
//!     let x = r.input("X")?.to_f32()?;
//!     let y: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
//!     Ok(Response::new(vec![Tensor::from_f32("Y", vec![y.len() as i64], &y)]))
//! });
//! let m = Model::new("double").unwrap();
//! let r = m.infer_inputs(vec![Tensor::from_f32("X", vec![2], &[1.0, 2.0])]).unwrap();
//! assert_eq!(r.output("Y").unwrap().to_f32().unwrap(), vec![2.0, 4.0]);
//! assert_eq!(testing::calls("double"), 1);
//! ```
//!
//! Registrations are per thread (each test has its own); inside the server they are never
//! consulted.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::{Error, Request, Response};

type Handler = Box<dyn Fn(&Request) -> Result<Response, Error>>;

thread_local! {
    static MODELS: RefCell<HashMap<String, (Handler, usize)>> = RefCell::new(HashMap::new());
}

/// Makes calls to `model` (any version) answer with `handler`, one request at a time.
pub fn serve(model: &str, handler: impl Fn(&Request) -> Result<Response, Error> + 'static) {
    MODELS.with(|m| {
        m.borrow_mut()
            .insert(model.to_string(), (Box::new(handler), 0))
    });
}

/// How many calls (batches) `model` has received since it was registered.
pub fn calls(model: &str) -> usize {
    MODELS.with(|m| m.borrow().get(model).map_or(0, |(_, n)| *n))
}

/// Forgets every registered model.
pub fn clear() {
    MODELS.with(|m| m.borrow_mut().clear());
}

/// One call: what the host does inside the server.
#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(crate) fn call(model: &str, batch: &[Request]) -> Result<Vec<Result<Response, Error>>, Error> {
    MODELS.with(|m| {
        let mut models = m.borrow_mut();
        let (handler, calls) = models.get_mut(model).ok_or_else(|| {
            Error::not_found(format!(
                "Request for unknown model: '{model}' is not found (register it with wisp_sdk::testing::serve)"
            ))
        })?;
        *calls += 1;
        Ok(batch.iter().map(handler).collect())
    })
}
