"""Triton's Python-backend API over `wisp:plugin@0.3.0`: requests, responses, errors, calls to
other models (BLS), a decoupled model's response senders, logging and `auto_complete_config`."""

import json

from wisp._tensor import Tensor


class TritonError(Exception):
    """An error for the client, as Triton's `pb_utils.TritonError(message, code)`; the code
    picks the HTTP status / gRPC code."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self):
        """The message."""
        return self._message

    def code(self):
        """The code (one of the class constants)."""
        return self._code


class TritonModelException(TritonError):
    """Triton's exception for a failed model call (raise it from `execute`)."""


# `ResponseSender.send` flags, as Triton's.
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class Request:
    """One request `execute` receives, as Triton's `pb_utils.InferenceRequest` on that side.
    `index` is its place in the batch (what a decoupled model's sender names)."""

    def __init__(self, request_id, inputs, requested_output_names, parameters, index=0):
        self._id = request_id
        self._inputs = inputs
        self._requested = requested_output_names
        self._parameters = parameters
        self._index = index

    def get_response_sender(self):
        """The sender of this request's responses, for a decoupled model
        (`model_transaction_policy { decoupled: true }`), as in Triton."""
        global _SENDERS_USED
        _SENDERS_USED = True
        return ResponseSender(self._index)

    def inputs(self):
        """Every input tensor."""
        return list(self._inputs)

    def request_id(self):
        """The client's request id ("" when it sent none)."""
        return self._id

    def requested_output_names(self):
        """The outputs the client asked for (empty: all)."""
        return list(self._requested)

    def parameters(self):
        """The request's parameters as a JSON object string (as Triton gives them)."""
        return json.dumps(self._parameters)

    def get_input_tensor_by_name(self, name):
        """The input called `name`, or None."""
        for t in self._inputs:
            if t.name() == name:
                return t
        return None


_SENDERS_USED = False


def _take_senders_used():
    """Whether `execute` asked for a response sender since the last call (wisp_app's check)."""
    global _SENDERS_USED
    used, _SENDERS_USED = _SENDERS_USED, False
    return used


class ResponseSender:
    """Sends a decoupled model's responses to one request while `execute` runs, as Triton's
    `InferenceResponseSender`: `send(response)` for each, then
    `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` (or the last response with that flag).
    `execute` then returns None. A failed send (the client has gone, a response that does not
    match the config, a send after the final one) raises `TritonError`."""

    def __init__(self, index):
        self._index = index

    def send(self, response=None, flags=0):
        """Sends `response` (an `InferenceResponse`, or None with the final flag alone)."""
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonError("send: a response is required unless flags has "
                              "TRITONSERVER_RESPONSE_COMPLETE_FINAL", TritonError.INVALID_ARG)
        from wisp import _host
        _host.send(self._index, response, final)

    def is_cancelled(self):
        """Whether the request's client has gone: stop working on it."""
        from wisp import _host
        return _host.is_cancelled(self._index)


class InferenceResponse:
    """A response: output tensors, or an error (`InferenceResponse(error=TritonError(...))`)."""

    def __init__(self, output_tensors=None, error=None):
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self):
        """The outputs."""
        return list(self._outputs)

    def has_error(self):
        """Whether the response is an error."""
        return self._error is not None

    def error(self):
        """The error, or None."""
        return self._error


class InferenceRequest:
    """A call to another model (Triton's BLS): `InferenceRequest(model_name=...,
    requested_output_names=[...], inputs=[...]).exec()` returns an `InferenceResponse`
    (check `has_error()`). Several requests to one model go in one batched call with
    `wisp.exec_batch(requests)`."""

    def __init__(self, model_name, inputs, requested_output_names=(), model_version=-1,
                 request_id="", parameters=None, **_ignored):
        self.model_name = model_name
        self.model_version = model_version
        self._inputs = list(inputs)
        self.requested_output_names = list(requested_output_names)
        self.request_id = request_id
        self.parameters = dict(parameters or {})

    def inputs(self):
        """The inputs."""
        return list(self._inputs)

    def get_input_tensor_by_name(self, name):
        """The input called `name`, or None."""
        for t in self._inputs:
            if t.name() == name:
                return t
        return None

    def exec(self):
        """Runs the request; errors come back in the response, as in Triton."""
        return exec_batch([self])[0]


def get_input_tensor_by_name(request, name):
    """The input of `request` called `name`, or None (Triton's helper)."""
    return request.get_input_tensor_by_name(name)


def get_output_tensor_by_name(response, name):
    """The output of `response` called `name`, or None (Triton's helper)."""
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def exec_batch(requests):
    """Runs requests to one model in one call, so that the model's scheduler batches them;
    one `InferenceResponse` per request."""
    if not requests:
        return []
    model = requests[0].model_name
    version = requests[0].model_version
    if any(r.model_name != model or r.model_version != version for r in requests):
        raise TritonError("exec_batch: every request must call the same model and version",
                          TritonError.INVALID_ARG)
    from wisp import _host

    return _host.call(model, None if version is None or version < 0 else version, requests)


class Logger:
    """Triton's `pb_utils.Logger`: lines go to the server's log, tagged with the model."""

    @staticmethod
    def log_info(message):
        from wisp import _host
        _host.log("info", message)

    @staticmethod
    def log_warn(message):
        from wisp import _host
        _host.log("warn", message)

    @staticmethod
    def log_error(message):
        from wisp import _host
        _host.log("error", message)

    @staticmethod
    def log_verbose(message):
        from wisp import _host
        _host.log("debug", message)

    @staticmethod
    def log(message, level="info"):
        from wisp import _host
        _host.log(level, message)


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives and returns: the
    plugin states its inputs, outputs and max batch size, so its model directory needs no
    `config.pbtxt`."""

    def __init__(self):
        self.inputs = []
        self.outputs = []
        self.max_batch_size = 0

    def _spec(self, d):
        dt = d["data_type"]
        dt = dt[len("TYPE_"):] if dt.startswith("TYPE_") else dt
        return {"name": d["name"], "datatype": "BYTES" if dt == "STRING" else dt,
                "dims": [int(x) for x in d["dims"]], "optional": bool(d.get("optional"))}

    def add_input(self, d):
        """`{"name": ..., "data_type": "TYPE_FP32", "dims": [...]}`"""
        self.inputs.append(self._spec(d))

    def add_output(self, d):
        """`{"name": ..., "data_type": "TYPE_FP32", "dims": [...]}`"""
        self.outputs.append(self._spec(d))

    def set_max_batch_size(self, n):
        """The max batch size (0: no batch dimension)."""
        self.max_batch_size = int(n)

    def set_dynamic_batching(self):
        """Accepted for Triton compatibility; turn batching on in `config.pbtxt`."""

    def as_dict(self):
        """Inputs, outputs and max batch size."""
        return {"input": self.inputs, "output": self.outputs,
                "max_batch_size": self.max_batch_size}
