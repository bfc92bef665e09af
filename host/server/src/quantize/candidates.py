"""`wisp quantize`'s candidates: the float model quantized to INT8 in each format that matters,
by ONNX Runtime's own tool. Run by `wisp quantize` with a Python that has onnxruntime:

    python candidates.py FLOAT.onnx MANIFEST.json OUT_DIR

MANIFEST.json lists the calibration requests: for each, its inputs as raw little-endian files
(name, datatype, shape, file relative to the manifest's directory). One JSON line per format on
stdout: {"format", "file"} or {"format", "error"}; the judging is Wisp's."""
import json
import os
import sys

import numpy as np
from onnxruntime import quantization as q

DTYPES = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT8": np.int8,
          "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8,
          "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64, "BOOL": np.bool_}

src, manifest_path, out_dir = sys.argv[1:4]
with open(manifest_path) as f:
    manifest = json.load(f)
base = os.path.dirname(os.path.abspath(manifest_path))


def feeds():
    for request in manifest["calibration"]:
        yield {i["name"]: np.fromfile(os.path.join(base, i["file"]), DTYPES[i["datatype"]])
               .reshape(i["shape"]) for i in request}


class Reader(q.CalibrationDataReader):
    def __init__(self):
        self.rows = feeds()

    def get_next(self):
        return next(self.rows, None)


# (name, how): static QDQ (the format both engines run) with unsigned or signed activations
# and per-tensor or per-channel weights, then dynamic (weights only; ONNX Runtime's integer
# operators, which tract also runs).
FORMATS = [
    ("qdq-u8act-tensor", ("static", q.QuantType.QUInt8, False)),
    ("qdq-u8act-channel", ("static", q.QuantType.QUInt8, True)),
    ("qdq-s8act-tensor", ("static", q.QuantType.QInt8, False)),
    ("qdq-s8act-channel", ("static", q.QuantType.QInt8, True)),
    ("dynamic-tensor", ("dynamic", None, False)),
    ("dynamic-channel", ("dynamic", None, True)),
]

for name, (kind, activations, per_channel) in FORMATS:
    out = os.path.join(out_dir, name + ".onnx")
    try:
        if kind == "static":
            q.quantize_static(src, out, Reader(), quant_format=q.QuantFormat.QDQ,
                              activation_type=activations, weight_type=q.QuantType.QInt8,
                              per_channel=per_channel)
        else:
            q.quantize_dynamic(src, out, per_channel=per_channel, weight_type=q.QuantType.QInt8)
        print(json.dumps({"format": name, "file": out}), flush=True)
    except Exception as e:  # one format failing leaves the others
        print(json.dumps({"format": name, "error": f"{type(e).__name__}: {e}"[:400]}), flush=True)
