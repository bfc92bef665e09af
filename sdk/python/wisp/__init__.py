"""Wisp plugins in Python: the guest side of `wisp:plugin@0.3.0`, with Triton's Python-backend
API (`triton_python_backend_utils`), so that a Triton `model.py` whose logic is plain Python
runs as a sandboxed WebAssembly component.

A plugin is a module `model` with a class `TritonPythonModel`:

    import wisp as pb_utils   # or: import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args): ...            # optional; args["model_config"] is JSON
        def execute(self, requests):               # a list of requests -> a list of responses
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "TEXT").as_list()
                out = pb_utils.Tensor("OUT", [s.lower() for s in x], "BYTES")
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
        def finalize(self): ...                     # optional, never called (instances are
                                                     # dropped, not shut down)

`wisp plugin build` (or `componentize-py ... componentize wisp_app`) turns it into
`model.wasm`. numpy cannot be had inside the component: tensors give `as_list()`,
`as_array()` (the stdlib `array` module), `as_memoryview()` and `as_bytes()` instead, and
`as_numpy()` works only where numpy is importable (native tests).
"""

from wisp._tensor import Tensor, DATATYPES
from wisp._api import (
    TritonError,
    TritonModelException,
    InferenceRequest,
    InferenceResponse,
    Request,
    ResponseSender,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    Logger,
    ModelConfig,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
    exec_batch,
)

__all__ = [
    "Tensor",
    "DATATYPES",
    "TritonError",
    "TritonModelException",
    "InferenceRequest",
    "InferenceResponse",
    "Request",
    "ResponseSender",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "Logger",
    "ModelConfig",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "exec_batch",
]
