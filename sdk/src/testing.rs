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

/// A response a decoupled plugin sent in a native test: the request's index in its batch,
/// the response (`None`: the final flag alone) and whether it was final.
pub type Sent = (u32, Option<Result<Response, Error>>, bool);

thread_local! {
    static MODELS: RefCell<HashMap<String, (Handler, usize)>> = RefCell::new(HashMap::new());
    static SENT: RefCell<Vec<Sent>> = const { RefCell::new(Vec::new()) };
}

/// The responses sent through [`crate::stream::ResponseSender`]s on this thread since the last
/// call, in order (taken: a second call returns only what was sent after the first).
pub fn sent() -> Vec<Sent> {
    SENT.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(crate) fn record(request: u32, response: Option<Result<Response, Error>>, last: bool) {
    SENT.with(|s| s.borrow_mut().push((request, response, last)));
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

/// Forgets every registered model and recorded response.
pub fn clear() {
    MODELS.with(|m| m.borrow_mut().clear());
    SENT.with(|s| s.borrow_mut().clear());
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
