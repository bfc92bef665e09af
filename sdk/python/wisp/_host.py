"""Where `wisp` meets the host: the component's imports inside the server, and the test double
(`wisp.testing`) outside it."""

from wisp._api import InferenceResponse, TritonError
from wisp._tensor import Tensor

try:
    from wit_world.imports import logging as _logging
    from wit_world.imports import models as _models
    from wit_world.imports import responses as _responses
    from wit_world.imports import types as _t
    from componentize_py_types import Err, Ok

    INSIDE = True
except ImportError:  # native: tests
    INSIDE = False

_ERROR_CODES = {}
_CODES_BACK = {}
# The WIT datatype enum by name, from a dictionary (`Enum[...]` is a Python-level lookup, paid
# for every tensor of every call; so is `.name`, hence `_name_`, the member's own attribute).
_DATATYPES = {}
if INSIDE:
    _DATATYPES = {d._name_: d for d in _t.Datatype}
    _ERROR_CODES = {
        TritonError.INVALID_ARG: _t.ErrorCode.INVALID_ARGUMENT,
        TritonError.NOT_FOUND: _t.ErrorCode.NOT_FOUND,
        TritonError.UNAVAILABLE: _t.ErrorCode.UNAVAILABLE,
        TritonError.UNSUPPORTED: _t.ErrorCode.UNSUPPORTED,
    }
    _CODES_BACK = {v: k for k, v in _ERROR_CODES.items()}


def to_wit_error(e):
    if isinstance(e, TritonError):
        return _t.Error(code=_ERROR_CODES.get(e.code(), _t.ErrorCode.INTERNAL), message=e.message())
    return _t.Error(code=_t.ErrorCode.INTERNAL, message=f"{type(e).__name__}: {e}")


def from_wit_error(e):
    return TritonError(e.message, _CODES_BACK.get(e.code, TritonError.INTERNAL))


def to_wit_tensor(t):
    return _t.Tensor(t._name, _DATATYPES[t._datatype], t._shape, t._data)


def from_wit_tensor(t):
    return Tensor._raw(t.name, t.datatype._name_, t.shape, t.data)


def to_wit_param(k, v):
    if isinstance(v, bool):
        value = _t.ParamValue_Bool(v)
    elif isinstance(v, int):
        value = _t.ParamValue_Int(v)
    elif isinstance(v, float):
        value = _t.ParamValue_Double(v)
    else:
        value = _t.ParamValue_Text(str(v))
    return _t.Param(key=k, value=value)


def call(model, version, requests):
    """One `models.infer` call (or the test double's answer)."""
    if not INSIDE:
        from wisp import testing

        return testing._call(model, requests)
    batch = [
        _t.Request(id=r.request_id, inputs=[to_wit_tensor(t) for t in r.inputs()],
                   requested_outputs=list(r.requested_output_names),
                   parameters=[to_wit_param(k, v) for k, v in r.parameters.items()])
        for r in requests
    ]
    try:
        results = _models.infer(model, version, batch)
    except Err as e:
        err = from_wit_error(e.value)
        return [InferenceResponse(error=err) for _ in requests]
    out = []
    for r in results:
        if isinstance(r, Ok):
            out.append(InferenceResponse([from_wit_tensor(t) for t in r.value.outputs]))
        else:
            out.append(InferenceResponse(error=from_wit_error(r.value)))
    return out


def log(level, message):
    if not INSIDE:
        print(f"[{level}] {message}")
        return
    _logging.log(_logging.Level[level.upper()], str(message))


def send(index, response, final):
    """One `responses.send` call (or, natively, a record for `wisp.testing.sent`)."""
    if not INSIDE:
        from wisp import testing

        testing._SENT.append((index, response, final))
        return
    if response is None:
        wit = None
    elif response.has_error():
        wit = Err(to_wit_error(response.error()))
    else:
        wit = Ok(_t.Response(outputs=[to_wit_tensor(t) for t in response.output_tensors()]))
    try:
        _responses.send(index, wit, final)
    except Err as e:
        raise from_wit_error(e.value)


def is_cancelled(index):
    """Whether request `index`'s client has gone (never, natively)."""
    if not INSIDE:
        return False
    return _responses.is_cancelled(index)
