//! Decoupled models (`model_transaction_policy { decoupled: true }` in the config): zero or
//! more responses per request, sent while `execute` runs, as Triton's Python backend sends
//! them through `request.get_response_sender()`.
//!
//! ```no_run
//! use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};
//!
//! /// Counts from 1 to N, one response per number.
//! struct Count;
//!
//! impl Plugin for Count {
//!     fn init(_params: &Params) -> Result<Self, Error> {
//!         Ok(Count)
//!     }
//!
//!     fn execute(&mut self, request: &Request) -> Result<Response, Error> {
//!         let n = request.input("N")?.to_i32()?[0];
//!         let sender = request.response_sender();
//!         for i in 1..=n {
//!             if sender.is_cancelled() {
//!                 break; // the client has gone
//!             }
//!             sender.send(Response::new(vec![Tensor::from_i32("I", vec![1], &[i])]))?;
//!         }
//!         // An empty response closes the request with the final flag alone.
//!         Ok(Response::new(vec![]))
//!     }
//! }
//! ```
//!
//! Each response is checked against the config as `execute`'s results are and reaches the
//! client at once (gRPC `ModelStreamInfer`, HTTP `generate_stream`). What `execute` returns for
//! a request is its last response: an empty [`Response`] sends the final flag alone, one with
//! outputs (or an error) is sent as the final response, and nothing more is sent for a request
//! whose final response went through [`ResponseSender::send_final`] or
//! [`ResponseSender::finish`].
//!
//! Outside the server (native unit tests) responses are recorded: read them with
//! [`crate::testing::sent`].

use std::cell::Cell;

use crate::{Error, Request, Response};

thread_local! {
    /// The batch `execute` is running: where its requests are in memory, and how many.
    static BATCH: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// Marks `batch` as the one being executed until the guard drops.
pub(crate) fn executing(batch: &[Request]) -> impl Drop {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BATCH.with(|b| b.set(None));
        }
    }
    BATCH.with(|b| b.set(Some((batch.as_ptr() as usize, batch.len()))));
    Reset
}

/// Where a decoupled model's responses to one request go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseSender {
    request: u32,
}

impl Request {
    /// The sender for this request's responses (a decoupled model). It must be a request of
    /// the batch being executed, as `execute` and `execute_batch` receive them; in a native
    /// test that calls `execute` directly it is request 0.
    pub fn response_sender(&self) -> ResponseSender {
        let at = self as *const Request as usize;
        let size = std::mem::size_of::<Request>().max(1);
        let request = BATCH.with(|b| match b.get() {
            None => 0,
            Some((base, len)) => at
                .checked_sub(base)
                .filter(|off| off % size == 0 && off / size < len)
                .map_or(u32::MAX, |off| (off / size) as u32),
        });
        ResponseSender { request }
    }
}

impl ResponseSender {
    /// The sender of request `index` of the batch being executed.
    pub fn for_request(index: usize) -> Self {
        ResponseSender {
            request: u32::try_from(index).unwrap_or(u32::MAX),
        }
    }

    /// The request's index in its batch.
    pub fn index(&self) -> u32 {
        self.request
    }

    /// Sends a response; more may follow.
    pub fn send(&self, response: Response) -> Result<(), Error> {
        self.raw(Some(Ok(response)), false)
    }

    /// Sends the request's last response.
    pub fn send_final(&self, response: Response) -> Result<(), Error> {
        self.raw(Some(Ok(response)), true)
    }

    /// Sends an error in place of a response (`last`: and ends the request).
    pub fn send_error(&self, error: Error, last: bool) -> Result<(), Error> {
        self.raw(Some(Err(error)), last)
    }

    /// Ends the request with the final flag alone (Triton's
    /// `TRITONSERVER_RESPONSE_COMPLETE_FINAL` without a response).
    pub fn finish(&self) -> Result<(), Error> {
        self.raw(None, true)
    }

    /// Whether the request's client has gone: stop working on it.
    pub fn is_cancelled(&self) -> bool {
        #[cfg(target_family = "wasm")]
        {
            crate::bindings::wisp::plugin::responses::is_cancelled(self.request)
        }
        #[cfg(not(target_family = "wasm"))]
        {
            false
        }
    }

    /// What every send is: the `wisp:plugin/responses` call.
    pub fn raw(&self, response: Option<Result<Response, Error>>, last: bool) -> Result<(), Error> {
        #[cfg(target_family = "wasm")]
        {
            crate::bindings::wisp::plugin::responses::send(
                self.request,
                response.as_ref().map(Result::as_ref),
                last,
            )
        }
        #[cfg(not(target_family = "wasm"))]
        {
            crate::testing::record(self.request, response, last);
            Ok(())
        }
    }
}
