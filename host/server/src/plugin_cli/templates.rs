//! What `wisp plugin new` writes: a plugin that upper-cases `TEXT` into `UPPER` and describes
//! itself (so its model directory needs no `config.pbtxt`), with a test, in each language.
//! `@NAME@` stands for the project's name and `@TYPE@` for its Rust type.

/// `Cargo.toml` of a Rust plugin.
pub(crate) const RUST_MANIFEST: &str = r#"[package]
name = "@NAME@"
version = "0.1.0"
edition = "2021"

[lib]
crate-type = ["cdylib"]

[dependencies]
# The SDK as `wisp plugin new` wrote it (the same files as the published wisp-sdk crate).
wisp-sdk = { path = "wisp-sdk" }

[profile.release]
opt-level = 3
lto = true
strip = "debuginfo"

# its own workspace, wherever it is created
[workspace]
"#;

/// `src/lib.rs` of a Rust plugin.
pub(crate) const RUST: &str = r#"//! @NAME@: a Wisp plugin. `TEXT` (one string per row) -> `UPPER`, upper-cased.

use wisp_sdk::{Datatype, Error, Params, Plugin, Request, Response, Signature, Tensor, TensorSpec};

/// The plugin's state (one per instance).
pub struct @TYPE@;

impl Plugin for @TYPE@ {
    /// Inputs, outputs and batching, so the model directory needs no config.pbtxt.
    fn describe() -> Option<Signature> {
        Some(Signature {
            inputs: vec![TensorSpec::new("TEXT", Datatype::Bytes, &[1])],
            outputs: vec![TensorSpec::new("UPPER", Datatype::Bytes, &[1])],
            max_batch_size: 8,
        })
    }

    fn init(_params: &Params) -> Result<Self, Error> {
        Ok(@TYPE@)
    }

    fn execute(&mut self, request: &Request) -> Result<Response, Error> {
        let text = request.input("TEXT")?;
        let upper: Vec<String> = text
            .strings()?
            .iter()
            .map(|s| String::from_utf8_lossy(s).to_uppercase())
            .collect();
        Ok(Response::new(vec![Tensor::from_strings("UPPER", text.shape.clone(), upper)]))
    }
}

wisp_sdk::export_plugin!(@TYPE@);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_cases() {
        let r = Request::new(vec![Tensor::from_strings("TEXT", vec![1, 1], ["wisp"])]);
        let out = @TYPE@.execute(&r).unwrap();
        let upper = out.output("UPPER").unwrap().strings().unwrap();
        assert_eq!(upper, vec![b"WISP".as_slice()]);
    }
}
"#;

/// `model.py` of a Python plugin.
pub(crate) const PYTHON: &str = r#""""@NAME@: a Wisp plugin in Triton's Python-backend style. TEXT -> UPPER, upper-cased."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Inputs, outputs and batching, so the model directory needs no config.pbtxt."""
        auto_complete_model_config.add_input(
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.add_output(
            {"name": "UPPER", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def initialize(self, args):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            upper = [s.upper() for s in text.as_strings()]
            out = pb_utils.Tensor("UPPER", upper, "BYTES", text.shape())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"#;

/// `test_model.py` of a Python plugin.
pub(crate) const PYTHON_TEST: &str = r#""""The plugin's logic, natively: python -m pytest"""
import triton_python_backend_utils as pb_utils
from model import TritonPythonModel
from wisp._api import Request


def test_upper_cases():
    t = pb_utils.Tensor("TEXT", [["wisp"]], "BYTES")
    [r] = TritonPythonModel().execute([Request("", [t], [], {})])
    assert pb_utils.get_output_tensor_by_name(r, "UPPER").as_strings() == ["WISP"]
"#;

/// `conftest.py` of a Python plugin: the tests import the project's SDK copy.
pub(crate) const PYTHON_CONFTEST: &str = r#"import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "wisp-sdk"))
"#;

/// `plugin.js` of a JavaScript plugin.
pub(crate) const JS: &str = r#"// @NAME@: a Wisp plugin in JavaScript. TEXT -> UPPER, upper-cased.
import { definePlugin, Tensor } from 'wisp';

export const plugin = definePlugin({
  // Inputs, outputs and batching, so the model directory needs no config.pbtxt.
  describe() {
    return {
      inputs: [{ name: 'TEXT', datatype: 'bytes', dims: [1] }],
      outputs: [{ name: 'UPPER', datatype: 'bytes', dims: [1] }],
      maxBatchSize: 8,
    };
  },
  execute(request) {
    const text = request.input('TEXT');
    return [Tensor.fromStrings('UPPER', text.shape, text.strings().map((s) => s.toUpperCase()))];
  },
});
"#;

/// `README.md` of every project; `@STEPS@` is replaced with the language's test line.
pub(crate) const README: &str = r#"# @NAME@

A Wisp plugin, made by `wisp plugin new`. It carries its own copy of the WIT package
(`wit/`) and of the SDK (`wisp-sdk/`), so it builds without a Wisp source tree.

```sh
@STEPS@
wisp plugin build .                                   # build/@NAME@/1/model.wasm
wisp plugin check build/@NAME@/1/model.wasm             # would the server load it?
wisp plugin run build/@NAME@/1/model.wasm --input 'TEXT=["hello"]'
wisp serve --model-repository build                   # then POST /v2/models/@NAME@/infer
```

The plugin describes its inputs and outputs, so `build/@NAME@/` needs no `config.pbtxt`; add
one beside `Cargo.toml`, `model.py` or `plugin.js` for parameters, batching or a sandbox, and
`build` copies it.
"#;

/// The Rust type a project's name gives: `text-norm_2` -> `TextNorm2`.
pub(crate) fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rust_type_is_named_after_the_project() {
        assert_eq!(type_name("shout"), "Shout");
        assert_eq!(type_name("text-norm_2"), "TextNorm2");
    }
}
