//! `wisp-sdk`: write Wisp plugins — WebAssembly components served as models — in plain Rust.
//!
//! A plugin implements [`Plugin`] and exports it with [`export_plugin!`]; `cargo build --release
//! --target wasm32-wasip2` turns the crate (`crate-type = ["cdylib"]`) into `model.wasm`. The
//! server calls [`Plugin::init`] once per instance with the model config's `parameters`, then
//! [`Plugin::execute_batch`] for every batch of requests.
//!
//! ```
//! use wisp_sdk::{Error, Params, Plugin, Request, Response, Tensor};
//!
//! /// Doubles every FP32 element of input `X` into output `Y`.
//! struct Double;
//!
//! impl Plugin for Double {
//!     fn init(_params: &Params) -> Result<Self, Error> {
//!         Ok(Double)
//!     }
//!
//!     fn execute(&mut self, request: &Request) -> Result<Response, Error> {
//!         let x = request.input("X")?;
//!         let y: Vec<f32> = x.to_f32()?.iter().map(|v| v * 2.0).collect();
//!         Ok(Response::new(vec![Tensor::from_f32("Y", x.shape.clone(), &y)]))
//!     }
//! }
//!
//! wisp_sdk::export_plugin!(Double);
//!
//! // Plugin logic is ordinary Rust: test it natively with `cargo test`.
//! let request = Request::new(vec![Tensor::from_f32("X", vec![2], &[1.0, 2.5])]);
//! let response = Double.execute(&request).unwrap();
//! assert_eq!(response.output("Y").unwrap().to_f32().unwrap(), vec![2.0, 5.0]);
//! ```
//!
//! Everything the sandbox denies (files, environment, network, clock) simply fails or reads as
//! empty unless the model config grants it; see `wit/README.md`.
#![deny(missing_docs)]

extern crate self as wisp_sdk;

mod tensor;

pub mod log;
pub mod nn;

/// Bindings generated from `wit/plugin.wit` (what [`export_plugin!`] builds on).
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wisp:plugin/model",
        pub_export_macro: true,
        default_bindings_module: "wisp_sdk::bindings",
        runtime_path: "wisp_sdk::__private::wit_bindgen::rt",
        generate_all,
    });
}

pub use bindings::wisp::plugin::types::{
    Datatype, Error, ErrorCode, Param, ParamValue, Request, Response, Tensor,
};

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }

    /// The request is bad (HTTP 400).
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::InvalidArgument, message)
    }

    /// Something named is missing (HTTP 404).
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::NotFound, message)
    }

    /// The plugin failed (HTTP 500).
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Internal, message)
    }

    /// Not supported (HTTP 400 / gRPC UNIMPLEMENTED).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unsupported, message)
    }

    /// Try again later (HTTP 503).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unavailable, message)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::NotFound => "not found",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Internal => "internal",
        })
    }
}

impl Request {
    /// A request with these inputs (no id, every output, no parameters); handy in tests.
    pub fn new(inputs: Vec<Tensor>) -> Self {
        Request {
            id: String::new(),
            inputs,
            requested_outputs: Vec::new(),
            parameters: Vec::new(),
        }
    }

    /// The input called `name`, or an `invalid-argument` error naming it.
    pub fn input(&self, name: &str) -> Result<&Tensor, Error> {
        self.inputs.iter().find(|t| t.name == name).ok_or_else(|| {
            let have: Vec<&str> = self.inputs.iter().map(|t| t.name.as_str()).collect();
            Error::invalid(format!("missing input '{name}' (got: {})", have.join(", ")))
        })
    }

    /// The request parameter `key`.
    pub fn param(&self, key: &str) -> Option<&ParamValue> {
        self.parameters
            .iter()
            .find(|p| p.key == key)
            .map(|p| &p.value)
    }

    /// Whether the client wants output `name` (it asked for it, or asked for none in
    /// particular).
    pub fn wants(&self, name: &str) -> bool {
        self.requested_outputs.is_empty() || self.requested_outputs.iter().any(|o| o == name)
    }
}

impl Response {
    /// A response with these outputs.
    pub fn new(outputs: Vec<Tensor>) -> Self {
        Response { outputs }
    }

    /// The output called `name`.
    pub fn output(&self, name: &str) -> Option<&Tensor> {
        self.outputs.iter().find(|t| t.name == name)
    }
}

/// The model config's `parameters`, as `init` receives them.
#[derive(Debug, Clone, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// Parameters from (key, value) pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Params(pairs)
    }

    /// Parameters from string pairs (handy in tests).
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        Params(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` parsed as `T`, `default` when unset, or an error naming the key.
    pub fn parse_or<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, Error> {
        match self.get(key).map(str::trim) {
            None | Some("") => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                Error::invalid(format!(
                    "parameter '{key}': cannot parse '{v}' as {}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }

    /// A comma-separated list (`"0.5, 0.5, 0.5"`) parsed element by element; `default` when
    /// unset.
    pub fn list_or<T: std::str::FromStr>(
        &self,
        key: &str,
        default: Vec<T>,
    ) -> Result<Vec<T>, Error> {
        match self.get(key).map(str::trim) {
            None | Some("") => Ok(default),
            Some(v) => v
                .split(',')
                .map(|s| {
                    s.trim().parse().map_err(|_| {
                        Error::invalid(format!(
                            "parameter '{key}': cannot parse '{}' as {}",
                            s.trim(),
                            std::any::type_name::<T>()
                        ))
                    })
                })
                .collect(),
        }
    }
}

/// A model plugin.
pub trait Plugin: Sized + 'static {
    /// Builds the plugin from the config's `parameters` (once per instance). An error fails
    /// the model's load with its message.
    fn init(params: &Params) -> Result<Self, Error>;

    /// Answers one request.
    fn execute(&mut self, request: &Request) -> Result<Response, Error>;

    /// Answers a batch, one result per request in order (with `dynamic_batching` a batch can
    /// hold several requests). The default calls [`Plugin::execute`] for each.
    fn execute_batch(&mut self, batch: Vec<Request>) -> Vec<Result<Response, Error>> {
        batch.iter().map(|r| self.execute(r)).collect()
    }
}

/// Exports a [`Plugin`] type as the component's `wisp:plugin/plugin` implementation.
///
/// Use it once, at the top level of the plugin crate: `wisp_sdk::export_plugin!(MyPlugin);`.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            struct WispPluginExport;

            impl $crate::bindings::exports::wisp::plugin::plugin::Guest for WispPluginExport {
                fn init(
                    parameters: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::std::result::Result<(), $crate::Error> {
                    $crate::__private::init::<$plugin>(parameters)
                }

                fn execute(
                    batch: ::std::vec::Vec<$crate::Request>,
                ) -> ::std::vec::Vec<::std::result::Result<$crate::Response, $crate::Error>>
                {
                    $crate::__private::execute::<$plugin>(batch)
                }
            }

    $crate::bindings::export!(WispPluginExport with_types_in $crate::bindings);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    use std::any::Any;
    use std::cell::RefCell;

    use super::{Error, Params, Plugin, Request, Response};

    pub use wit_bindgen;

    thread_local! {
        static PLUGIN: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
    }

    pub fn init<P: Plugin>(parameters: Vec<(String, String)>) -> Result<(), Error> {
        let plugin = P::init(&Params::new(parameters))?;
        PLUGIN.with(|p| *p.borrow_mut() = Some(Box::new(plugin)));
        Ok(())
    }

    pub fn execute<P: Plugin>(batch: Vec<Request>) -> Vec<Result<Response, Error>> {
        PLUGIN.with(|p| {
            let mut slot = p.borrow_mut();
            match slot.as_mut().and_then(|b| b.downcast_mut::<P>()) {
                Some(plugin) => plugin.execute_batch(batch),
                None => batch
                    .iter()
                    .map(|_| Err(Error::internal("execute called before init")))
                    .collect(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_and_name_the_key() {
        let p = Params::from_pairs(&[("k", "7"), ("list", "0.5, 1"), ("bad", "x")]);
        assert_eq!(p.parse_or("k", 0u32).unwrap(), 7);
        assert_eq!(p.parse_or("missing", 3u32).unwrap(), 3);
        assert_eq!(p.list_or::<f32>("list", vec![]).unwrap(), vec![0.5f32, 1.0]);
        let e = p.parse_or("bad", 0u32).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(e.message.contains("'bad'"));
    }

    #[test]
    fn requests_name_missing_inputs() {
        let r = Request::new(vec![Tensor::from_u8("A", vec![1], &[1])]);
        assert!(r.input("A").is_ok());
        let e = r.input("B").unwrap_err();
        assert!(e.message.contains("'B'") && e.message.contains("A"));
        assert!(r.wants("anything"));
    }
}
