"""Wisp in-process: a Triton-style model repository served inside this Python process.

    import numpy as np
    import wisp

    server = wisp.Server(model_repository="model_repo")
    out = server.infer("add_sub", {"INPUT0": np.ones((1, 16), np.float32),
                                   "INPUT1": np.ones((1, 16), np.float32)})
    out["OUTPUT0"]            # a numpy array
    server.shutdown()

The models, configs, schedulers (batching), plugins, statistics and error messages are the
server's own (the Rust `wisp_server::embed` API underneath); only the sockets are gone. Calls
release the GIL, so threads can infer concurrently and their requests batch together.
"""
import struct
from typing import Dict, Iterable, List, Mapping, Optional

import numpy as np

from ._wisp import (AlreadyExistsError, InternalError, InvalidArgumentError, NotFoundError,
                    ResourceExhaustedError, UnavailableError, UnsupportedError, WispError)
from ._wisp import Server as _Server

__all__ = ["Server", "ModelIndexEntry", "WispError", "InvalidArgumentError", "NotFoundError",
           "UnavailableError", "UnsupportedError", "AlreadyExistsError", "InternalError",
           "ResourceExhaustedError"]

# KServe datatype <-> numpy dtype. BYTES is an object array of bytes (as tritonclient has it).
_TO_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items()}


def _datatype(name: str, array: np.ndarray) -> str:
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _FROM_NUMPY[array.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"input '{name}': numpy dtype {array.dtype} has no KServe datatype") from None


def _encode_bytes(name: str, array: np.ndarray) -> bytes:
    parts = []
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, np.bytes_)):
            raise InvalidArgumentError(f"input '{name}': BYTES elements must be bytes or str")
        parts.append(struct.pack("<I", len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def _decode_bytes(data: bytes, shape: List[int]) -> np.ndarray:
    items, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        items.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


def _to_wire(name: str, value) -> tuple:
    array = np.asarray(value)
    datatype = _datatype(name, array)
    if datatype == "BYTES":
        return (name, datatype, list(array.shape), _encode_bytes(name, array))
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return (name, datatype, list(array.shape), array.tobytes())


def _from_wire(datatype: str, shape: List[int], data: bytes) -> np.ndarray:
    if datatype == "BYTES":
        return _decode_bytes(data, shape)
    if datatype == "BF16":
        # numpy has no bfloat16: widen to float32 (the upper 16 bits of an f32).
        raw = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=np.dtype(_TO_NUMPY[datatype]).newbyteorder("<")).reshape(shape)


class ModelIndexEntry:
    """One row of the repository index: a model version, its state and why."""

    __slots__ = ("name", "version", "state", "reason")

    def __init__(self, name: str, version: Optional[int], state: str, reason: str):
        self.name, self.version, self.state, self.reason = name, version, state, reason

    def __repr__(self) -> str:
        return (f"ModelIndexEntry(name={self.name!r}, version={self.version!r}, "
                f"state={self.state!r}, reason={self.reason!r})")


class Server:
    """Wisp serving `model_repository` (a path or a list of paths) in this process.

    Keyword options follow `wisp serve`'s flags: `model_control_mode` ("none", "poll",
    "explicit"), `load_model` (models loaded at start in explicit mode), `onnx_engine`
    ("auto", "onnxruntime", "tract"), `strict_readiness`, `exit_on_error`,
    `repository_poll_secs`. Use it as a context manager, or call `shutdown()`.
    """

    def __init__(self, model_repository, **options):
        self._server = _Server(model_repository, **options)

    def infer(self, model: str, inputs: Mapping[str, "np.typing.ArrayLike"], *,
              version: Optional[str] = None, outputs: Optional[Iterable[str]] = None,
              parameters: Optional[Dict[str, object]] = None) -> Dict[str, np.ndarray]:
        """Runs `inputs` (name -> array) through `model`; returns name -> array for `outputs`
        (default: every output). Shapes include the batch dimension when the model batches.
        `parameters` are request parameters (`priority`, `timeout`, `sequence_id`, ...)."""
        wire = [_to_wire(name, value) for name, value in inputs.items()]
        out = self._server.infer(model, wire, version=None if version is None else str(version),
                                 outputs=list(outputs or []), parameters=parameters)
        return {name: _from_wire(dt, shape, data) for name, dt, shape, data in out}

    def load(self, model: str, config: Optional[str] = None) -> None:
        """Loads or reloads `model` (explicit control mode); `config` is a JSON ModelConfig
        that replaces its config.pbtxt."""
        self._server.load(model, config)

    def unload(self, model: str) -> None:
        """Unloads `model` (explicit control mode); running requests finish."""
        self._server.unload(model)

    def models(self) -> List[ModelIndexEntry]:
        """The repository index."""
        return [ModelIndexEntry(*row) for row in self._server.models()]

    def model_ready(self, model: str, version: Optional[str] = None) -> bool:
        """Whether `model` (or one version of it) is ready."""
        return self._server.model_ready(model, None if version is None else str(version))

    def metadata(self, model: str, version: Optional[str] = None) -> dict:
        """`{"inputs": [...], "outputs": [...]}`, each `{"name", "datatype", "shape"}`."""
        inputs, outputs = self._server.metadata(model, None if version is None else str(version))
        rows = lambda ts: [{"name": n, "datatype": d, "shape": s} for n, d, s in ts]
        return {"name": model, "inputs": rows(inputs), "outputs": rows(outputs)}

    def shutdown(self) -> None:
        """Lets running requests finish, drains the models and stops."""
        self._server.shutdown()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
