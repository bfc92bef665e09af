"""A version earns its place: an INT8 twin of a float model, made by ONNX Runtime's own
quantizer, serves after its gate measured it against the float version; a version whose
answers are wrong is refused at load, the INT8 one keeps serving, and the index, the load
answer and /metrics say what was measured. On both engines, through the real binary, the
HTTP repository API and tritonclient."""
import os
import re
import shutil
import subprocess
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


QUANTIZE_CONFIG = CONFIG.replace(
    '{ key: "gate.max_latency_ratio" value { string_value: "50" } }',
    '{ key: "gate.max_latency_ratio" value { string_value: "50" } },\n'
    '  { key: "gate.baseline_version" value { string_value: "1" } }')


def calibration_dir(n):
    d = tempfile.mkdtemp(prefix="wisp-calibration-")
    for i in range(n):
        batch = 2 if i == 4 else 1  # a held-out body of two items: two held-out samples
        x = RNG.normal(size=(batch, 16)).astype(np.float32)
        with open(os.path.join(d, f"{i:02}.json"), "w") as f:
            f.write('{"inputs": [{"name": "X", "shape": [%d, 16], "datatype": "FP32", "data": %s}]}'
                    % (batch, x.flatten().tolist()))
    return d


def quantize_cli(*args):
    from conftest import wisp_command
    return subprocess.run([*wisp_command(), "quantize", *args], capture_output=True, text=True,
                          timeout=600)


def scorer_repo():
    repo = tempfile.mkdtemp(prefix="wisp-quantize-")
    os.makedirs(os.path.join(repo, "scorer", "warmup"))
    with open(os.path.join(repo, "scorer", "config.pbtxt"), "w") as f:
        f.write(QUANTIZE_CONFIG)
    RNG.normal(size=16).astype(np.float32).tofile(os.path.join(repo, "scorer", "warmup", "x.bin"))
    save_version(repo, 1, float_model(W))
    return repo


@pytest.mark.parametrize("engine", ENGINES)
def test_wisp_quantize_writes_the_best_int8_version_that_passes_the_gate(engine):
    repo = scorer_repo()
    cal = calibration_dir(10)
    try:
        model = os.path.join(repo, "scorer")
        r = quantize_cli(model, "--calibration", cal, "--onnx-engine", engine)
        assert r.returncode == 0, r.stderr + r.stdout
        assert "judging 6 candidate(s) against version 1 on 3 held-out sample(s)" in r.stderr, r.stderr
        rows = [line for line in r.stdout.splitlines() if line.startswith("| qdq-") or line.startswith("| dynamic-")]
        assert len(rows) == 6 and any("| passed |" in row for row in rows), r.stdout
        assert f"wrote {model}/2/model.onnx" in r.stdout, r.stdout
        # The version written is INT8, and a server started on the repository judges it
        # against version 1 (gate.baseline_version) before serving it.
        int8 = onnx.load(os.path.join(model, "2", "model.onnx"))
        assert any(n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") for n in int8.graph.node)
        proc, log, urls = start_wisp(repo, engine, f"quantize-{engine}.log")
        try:
            meta = httpclient.InferenceServerClient(urls["url"]).get_model_metadata("scorer")
            assert meta["versions"] == ["2"], meta
            assert meta["parameters"]["gate"].startswith("passed against version 1"), meta
        finally:
            stop_wisp(proc, log)
        # A second run does not overwrite what it wrote.
        r = quantize_cli(model, "--calibration", cal, "--version", "2")
        assert r.returncode == 1 and "version 2 exists already" in r.stderr, r.stderr
    finally:
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(cal, ignore_errors=True)


def test_wisp_quantize_refuses_bad_calibration_with_a_clear_error():
    repo = scorer_repo()
    cal = calibration_dir(1)
    try:
        model = os.path.join(repo, "scorer")
        r = quantize_cli(model, "--calibration", os.path.join(repo, "missing"))
        assert r.returncode == 1 and "--calibration: cannot read" in r.stderr, r.stderr
        r = quantize_cli(model, "--calibration", cal)
        assert r.returncode == 1 and "needs at least two request bodies" in r.stderr, r.stderr
        with open(os.path.join(cal, "05.json"), "w") as f:
            f.write('{"inputs": [{"name": "NOPE", "shape": [1, 16], "datatype": "FP32", "data": %s}]}'
                    % ([0.0] * 16))
        r = quantize_cli(model, "--calibration", cal)
        assert r.returncode == 1 and "05.json" in r.stderr and "NOPE" in r.stderr, r.stderr
        os.remove(os.path.join(cal, "05.json"))
        # A FIFO where a body should be: refused as not a regular file, never read (a read
        # would hang).
        os.mkfifo(os.path.join(cal, "03.json"))
        r = quantize_cli(model, "--calibration", cal)
        assert r.returncode == 1 and "03.json" in r.stderr, r.stderr
        os.remove(os.path.join(cal, "03.json"))
        with open(os.path.join(cal, "02.json"), "w") as f:
            f.write('{"inputs": [{"name": "X", "shape": [1, 16], "datatype": "FP32", "data": %s}]}'
                    % ([0.5] * 16))
        # A Python without ONNX Runtime's quantizer: the command to install it is named.
        r = quantize_cli(model, "--calibration", cal, "--python", "/bin/false")
        assert r.returncode == 1 and "pip install onnxruntime" in r.stderr, r.stderr
        assert sorted(os.listdir(model)) == ["1", "config.pbtxt", "warmup"], "nothing written"
    finally:
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(cal, ignore_errors=True)
