"""Tensors without numpy: KServe's binary layout (row-major, little-endian; BOOL one byte per
element; BYTES elements each a 4-byte little-endian length and the bytes)."""

import array
import struct
import sys
from itertools import repeat

# datatype -> (element size in bytes or None for BYTES, array/memoryview typecode or None)
DATATYPES = {
    "BOOL": (1, None),
    "UINT8": (1, "B"),
    "UINT16": (2, "H"),
    "UINT32": (4, "I"),
    "UINT64": (8, "Q"),
    "INT8": (1, "b"),
    "INT16": (2, "h"),
    "INT32": (4, "i"),
    "INT64": (8, "q"),
    "FP16": (2, "e"),
    "FP32": (4, "f"),
    "FP64": (8, "d"),
    "BF16": (2, None),
    "BYTES": (None, None),
}

# The datatype an `array` typecode is, from the table above (`l`/`L` are in no row: 8 bytes
# on 64-bit hosts, 4 in wasm32; such arrays are converted element by element).
_ARRAY_DATATYPES = {code: dt for dt, (_, code) in DATATYPES.items() if code}

_NUMPY_DTYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64",
}


_SEQ = (list, tuple)


def _flatten(values, shape):
    """Flattens nested lists level by level, checking that they are rectangular; fills
    `shape`. Each level is one pass of C-level `extend`s, not a Python call per element."""
    probe = values
    while isinstance(probe, _SEQ):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    if not shape:
        return [values]
    flat = values
    for width in shape[1:]:
        rows, flat = flat, []
        for row in rows:
            if not isinstance(row, _SEQ) or len(row) != width:
                raise ValueError("nested lists are not rectangular")
            flat.extend(row)
    if any(map(isinstance, flat, repeat(_SEQ, len(flat)))):
        raise ValueError("nested lists are not rectangular")
    return flat


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _encode(datatype, flat):
    if datatype == "BYTES":
        parts = []
        for v in flat:
            b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    if datatype == "BOOL":
        return bytes(1 if v else 0 for v in flat)
    if datatype == "BF16":
        out = bytearray()
        for v in flat:
            out += struct.pack("<f", float(v))[2:4]
        return bytes(out)
    code = DATATYPES[datatype][1]
    a = array.array("f" if code == "e" else code, flat)
    if code == "e":
        return b"".join(struct.pack("<e", v) for v in flat)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


class Tensor:
    """A named tensor, as Triton's `pb_utils.Tensor`.

    `Tensor(name, values, datatype=None, shape=None)`: `values` is a (nested) list, an
    `array.array`, `bytes` in the binary layout (then `datatype` and `shape` are required), or a
    numpy array where numpy exists. The datatype is guessed from lists when not given (bool,
    int -> INT64, float -> FP32, str/bytes -> BYTES).
    """

    def __init__(self, name, values, datatype=None, shape=None):
        self._name = name
        if isinstance(values, (bytes, bytearray, memoryview)):
            if datatype is None or shape is None:
                raise ValueError(f"tensor '{name}': raw bytes need a datatype and a shape")
            self._datatype, self._shape, self._data = datatype, list(shape), bytes(values)
            self._check()
            return
        if isinstance(values, array.array):
            if self._from_array(values, datatype, shape):
                return
            values = values.tolist()
        elif not isinstance(values, _SEQ) and hasattr(values, "dtype") and hasattr(
                values, "tobytes"):  # numpy (probed last: a failed hasattr raises inside)
            import numpy as np

            arr = np.ascontiguousarray(values)
            if datatype is None:
                datatype = _from_numpy(arr.dtype)
            shape = list(arr.shape) if shape is None else list(shape)
            if datatype == "BYTES":
                values = arr.reshape(-1).tolist()
            else:
                self._name, self._datatype, self._shape = name, datatype, shape
                self._data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
                self._check()
                return
        found = []
        flat = _flatten(values, found)
        shape = found if shape is None else list(shape)
        if datatype is None:
            datatype = _guess(flat)
        if datatype not in DATATYPES:
            raise ValueError(f"tensor '{name}': unknown datatype '{datatype}'")
        if _count(shape) != len(flat):
            raise ValueError(
                f"tensor '{name}': {len(flat)} elements do not fill shape {shape}")
        self._datatype, self._shape, self._data = datatype, shape, _encode(datatype, flat)

    def _from_array(self, a, datatype, shape):
        """An `array.array` whose typecode is the datatype's is taken as it is, without a
        pass over its elements (False: it needs converting)."""
        datatype = datatype or _ARRAY_DATATYPES.get(a.typecode)
        if datatype is None or DATATYPES.get(datatype, (0, None))[1] != a.typecode:
            return False
        self._datatype = datatype
        self._shape = [len(a)] if shape is None else list(shape)
        if sys.byteorder != "little":
            a = array.array(a.typecode, a)
            a.byteswap()
        self._data = a.tobytes()
        self._check()
        return True

    def _check(self):
        if self._datatype not in DATATYPES:
            raise ValueError(f"tensor '{self._name}': unknown datatype '{self._datatype}'")
        size = DATATYPES[self._datatype][0]
        if size is not None and len(self._data) != size * _count(self._shape):
            raise ValueError(
                f"tensor '{self._name}': {len(self._data)} bytes do not fit "
                f"{self._datatype} {self._shape}")

    @classmethod
    def _raw(cls, name, datatype, shape, data):
        t = cls.__new__(cls)
        t._name, t._datatype, t._shape = name, datatype, shape
        t._data = data if type(data) is bytes else bytes(data)
        return t

    def name(self):
        """The tensor's name."""
        return self._name

    def datatype(self):
        """KServe's datatype name (`FP32`, `BYTES`, ...)."""
        return self._datatype

    def triton_dtype(self):
        """The datatype as Triton's config names it (`TYPE_FP32`, `TYPE_STRING`, ...)."""
        return "TYPE_STRING" if self._datatype == "BYTES" else "TYPE_" + self._datatype

    def shape(self):
        """The shape (batch dimension included when the model batches)."""
        return list(self._shape)

    def as_bytes(self):
        """The raw data in KServe's binary layout."""
        return self._data

    def as_memoryview(self):
        """The data as a typed memoryview (numeric datatypes but BF16), without a copy."""
        code = DATATYPES[self._datatype][1]
        if code is None or sys.byteorder != "little":
            raise TritonError(f"tensor '{self._name}': {self._datatype} has no memoryview form; "
                              "use as_list()")
        return memoryview(self._data).cast(code)

    def as_array(self):
        """The data as an `array.array` (numeric datatypes but FP16 and BF16)."""
        code = DATATYPES[self._datatype][1]
        if code is None or code == "e":
            raise TritonError(f"tensor '{self._name}': {self._datatype} has no array form; "
                              "use as_list()")
        a = array.array(code)
        a.frombytes(self._data)
        if sys.byteorder != "little":
            a.byteswap()
        return a

    def as_list(self):
        """The elements, flat: numbers, bools, or `bytes` for BYTES (use
        `as_strings()` for text)."""
        dt = self._datatype
        if dt == "BYTES":
            out, i, d = [], 0, self._data
            while i < len(d):
                (n,) = struct.unpack_from("<I", d, i)
                out.append(d[i + 4:i + 4 + n])
                i += 4 + n
            return out
        if dt == "BOOL":
            return [b != 0 for b in self._data]
        if dt == "BF16":
            return [struct.unpack("<f", b"\0\0" + self._data[i:i + 2])[0]
                    for i in range(0, len(self._data), 2)]
        if dt == "FP16":
            return [v for (v,) in struct.iter_unpack("<e", self._data)]
        return self.as_array().tolist()

    def as_strings(self, encoding="utf-8"):
        """A BYTES tensor's elements, decoded."""
        return [b.decode(encoding) for b in self.as_list()]

    def as_numpy(self):
        """The tensor as a numpy array, where numpy can be imported (not inside a wasm plugin:
        use `as_list()`, `as_array()` or `as_memoryview()` there)."""
        try:
            import numpy as np
        except ImportError:
            raise TritonError(
                "numpy is not available inside a wasm plugin: use as_list(), as_array() or "
                "as_memoryview()") from None
        if self._datatype == "BYTES":
            return np.array(self.as_list(), dtype=np.object_).reshape(self._shape)
        if self._datatype == "BF16":
            return np.array(self.as_list(), dtype=np.float32).reshape(self._shape)
        dt = np.dtype(_NUMPY_DTYPES[self._datatype]).newbyteorder("<")
        return np.frombuffer(self._data, dtype=dt).reshape(self._shape)

    def __repr__(self):
        return f"Tensor({self._name!r}, {self._datatype}, {self._shape})"


def _guess(flat):
    if not flat:
        return "FP32"
    v = flat[0]
    if isinstance(v, bool):
        return "BOOL"
    if isinstance(v, int):
        return "INT64"
    if isinstance(v, float):
        return "FP32"
    if isinstance(v, (str, bytes, bytearray)):
        return "BYTES"
    raise ValueError(f"cannot guess a datatype for {type(v).__name__}")


def _from_numpy(dtype):
    for k, v in _NUMPY_DTYPES.items():
        if dtype.name == v:
            return k
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    raise ValueError(f"numpy dtype {dtype} has no KServe datatype")


from wisp._api import TritonError  # noqa: E402  (the error type is defined with the API)
