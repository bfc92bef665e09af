"""A version earns its place: an INT8 twin of a float model, made by ONNX Runtime's own
quantizer, serves after its gate measured it against the float version; a version whose
answers are wrong is refused at load, the INT8 one keeps serving, and the index, the load
answer and /metrics say what was measured. On both engines, through the real binary, the
HTTP repository API and tritonclient."""
import os
import re
import shutil
import tempfile
import urllib.request

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from conftest import ENGINES, start_wisp, stop_wisp

CONFIG = """name: "scorer"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 8 ] } ]
parameters [
  { key: "gate.min_cosine" value { string_value: "0.99" } },
  { key: "gate.min_top1" value { string_value: "0.9" } },
  { key: "gate.max_latency_ratio" value { string_value: "50" } }
]
model_warmup [
  { name: "held-out" batch_size: 1
    inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "x.bin" } } },
  { name: "spread" batch_size: 8
    inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } }
]
"""

RNG = np.random.default_rng(7)
W = RNG.normal(size=(16, 8)).astype(np.float32)
B = RNG.normal(size=(8,)).astype(np.float32)


def float_model(weights):
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["h"]),
         helper.make_node("Add", ["h", "B"], ["Y"])],
        "scorer",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(B, "B")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def save_version(repo, version, model):
    d = os.path.join(repo, "scorer", str(version))
    os.makedirs(d, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    return os.path.join(d, "model.onnx")


def quantize(src, dst):
    """QDQ INT8 with ONNX Runtime's own tool, calibrated on 64 inputs like the held-out ones."""
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.rows = iter([{"X": RNG.normal(size=(1, 16)).astype(np.float32)} for _ in range(64)])

        def get_next(self):
            return next(self.rows, None)

    q.quantize_static(src, dst, Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)


def post(url, path):
    req = urllib.request.Request(f"http://{url}{path}", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(metrics_text, name):
    m = re.search(rf'^{name}{{model="scorer"}} (\d+)', metrics_text, re.M)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("engine", ENGINES)
def test_an_int8_version_serves_after_its_gate_and_a_wrong_one_does_not(engine):
    repo = tempfile.mkdtemp(prefix="wisp-gate-")
    try:
        os.makedirs(os.path.join(repo, "scorer", "warmup"))
        with open(os.path.join(repo, "scorer", "config.pbtxt"), "w") as f:
            f.write(CONFIG)
        RNG.normal(size=16).astype(np.float32).tofile(os.path.join(repo, "scorer", "warmup", "x.bin"))
        v1 = save_version(repo, 1, float_model(W))
        metrics_port = None
        proc, log, urls = start_wisp(repo, engine, f"gate-{engine}.log",
                                     ["--model-control-mode", "explicit", "--load-model", "scorer",
                                      "--allow-unauthenticated-control"])
        try:
            url = urls["url"]
            client = httpclient.InferenceServerClient(url)
            args = proc.args
            metrics_port = args[args.index("--metrics-port") + 1]

            def metrics():
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    return r.read().decode()

            # Version 2: the INT8 twin, made from version 1 by ONNX Runtime's quantizer.
            os.makedirs(os.path.join(repo, "scorer", "2"))
            quantize(v1, os.path.join(repo, "scorer", "2", "model.onnx"))
            status, body = post(url, "/v2/repository/models/scorer/load")
            assert status == 200, body
            meta = client.get_model_metadata("scorer")
            assert meta["versions"] == ["2"], meta
            gate = meta["parameters"]["gate"]
            assert gate.startswith("passed against version 1 on 2 held-out sample(s), 9 output row(s)"), gate
            cosine = float(re.search(r"min cosine ([0-9.]+)", gate).group(1))
            assert 0.99 <= cosine <= 1.0, gate
            assert metric(metrics(), "wisp_model_gate_passed_total") == 1

            x = RNG.normal(size=(1, 16)).astype(np.float32)
            inp = httpclient.InferInput("X", [1, 16], "FP32")
            inp.set_data_from_numpy(x)
            y = client.infer("scorer", [inp]).as_numpy("Y")
            assert y.argmax() == (x @ W + B).argmax()

            # Version 3: wrong weights. Its load is refused with what was measured, and the
            # INT8 version keeps serving.
            save_version(repo, 3, float_model(-W))
            status, body = post(url, "/v2/repository/models/scorer/load")
            assert status == 400, body
            assert "failed its gate: min cosine" in body and "under gate.min_cosine 0.99" in body, body
            assert "measured against version 2" in body, body
            assert client.get_model_metadata("scorer")["versions"] == ["2"]
            np.testing.assert_array_equal(client.infer("scorer", [inp]).as_numpy("Y"), y)
            index = client.get_model_repository_index()
            row = next(r for r in index if r["name"] == "scorer")
            assert row["state"] == "READY" and "failed its gate" in row["reason"], row
            assert metric(metrics(), "wisp_model_gate_failed_total") == 1
        finally:
            stop_wisp(proc, log)
    finally:
        shutil.rmtree(repo, ignore_errors=True)
