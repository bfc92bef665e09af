"""`import wisp`: the in-process Python API (host/python) against the same repository served over
HTTP by the real binary, through NVIDIA's client. Same answers, same error words, and load,
unload, concurrency and shutdown behave as the server's do.

The module is the workspace build's `target/<profile>/lib_wisp.so` (beside `WISP_BIN`) put into
a package directory with `host/python/python/wisp`, as `pip install ./host/python` would."""
import importlib
import os
import shutil
import sys
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ENGINES, ROOT, start_wisp, stop_wisp

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "repo")


@pytest.fixture(scope="module")
def wisp(tmp_path_factory):
    binary = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
    lib = os.path.join(os.path.dirname(binary), "lib_wisp.so")
    assert os.path.exists(lib), f"{lib} is missing: build the workspace (cargo build --workspace)"
    pkg = tmp_path_factory.mktemp("pywisp")
    shutil.copytree(os.path.join(ROOT, "host", "python", "python", "wisp"), pkg / "wisp")
    shutil.copy(lib, pkg / "wisp" / "_wisp.abi3.so")
    sys.path.insert(0, str(pkg))
    try:
        yield importlib.import_module("wisp")
    finally:
        sys.path.remove(str(pkg))


@pytest.fixture(scope="module", params=ENGINES)
def both(request, wisp):
    """The fixture repository in-process and over HTTP, on one engine."""
    engine = request.param
    inproc = wisp.Server(FIXTURES, onnx_engine=engine)
    proc, log, urls = start_wisp(FIXTURES, engine, f"conformance-inprocess-{engine}.log")
    client = httpclient.InferenceServerClient(url=urls["url"])
    yield inproc, client
    inproc.shutdown()
    stop_wisp(proc, log)


def over_http(client, model, inputs):
    wire = []
    for name, value in inputs.items():
        dt = "BYTES" if value.dtype == object else {
            np.float32: "FP32", np.int64: "INT64"}[value.dtype.type]
        t = httpclient.InferInput(name, list(value.shape), dt)
        t.set_data_from_numpy(value)
        wire.append(t)
    result = client.infer(model, wire)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_same_answers_as_over_http(both):
    inproc, client = both
    rng = np.random.default_rng(7)
    cases = {
        "add_sub": {"INPUT0": rng.standard_normal((3, 16), dtype=np.float32),
                    "INPUT1": rng.standard_normal((3, 16), dtype=np.float32)},
        "add_int64": {"A": np.arange(8, dtype=np.int64).reshape(2, 4) * 3,
                      "B": np.arange(8, dtype=np.int64).reshape(2, 4)},
        "strings": {"text": np.array([[b"hello", "wörld".encode()]], dtype=object)},
    }
    for model, inputs in cases.items():
        meta = inproc.metadata(model)
        inputs = {i["name"]: inputs[i["name"]] for i in meta["inputs"]}
        mine = inproc.infer(model, inputs)
        theirs = over_http(client, model, inputs)
        assert sorted(mine) == sorted(theirs), model
        for name in mine:
            assert mine[name].shape == theirs[name].shape, (model, name)
            assert mine[name].dtype == theirs[name].dtype, (model, name)
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{model} {name}")
    add = inproc.infer("add_sub", cases["add_sub"], outputs=["OUTPUT1"])
    assert list(add) == ["OUTPUT1"]
    np.testing.assert_allclose(add["OUTPUT1"], cases["add_sub"]["INPUT0"] - cases["add_sub"]["INPUT1"])


def test_same_errors_as_over_http(both, wisp):
    inproc, client = both
    bad = {"INPUT0": np.ones((1, 16), np.int64), "INPUT1": np.ones((1, 16), np.float32)}
    with pytest.raises(wisp.InvalidArgumentError) as mine:
        inproc.infer("add_sub", bad)
    with pytest.raises(InferenceServerException) as theirs:
        over_http(client, "add_sub", bad)
    assert str(mine.value) in theirs.value.message()
    assert "data-type is 'INT64'" in str(mine.value)
    with pytest.raises(wisp.NotFoundError):
        inproc.infer("no_such_model", bad)
    with pytest.raises(wisp.InvalidArgumentError, match="numpy dtype complex64"):
        inproc.infer("add_sub", {"INPUT0": np.ones((1, 16), np.complex64)})
    assert isinstance(mine.value, wisp.WispError)


def test_threads_infer_concurrently(both):
    inproc, _ = both
    failures = []

    def worker(k):
        for i in range(10):
            a = np.full((1, 16), k * 100 + i, np.float32)
            out = inproc.infer("add_sub", {"INPUT0": a, "INPUT1": np.ones((1, 16), np.float32)})
            if not np.array_equal(out["OUTPUT0"], a + 1):
                failures.append((k, i))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_load_unload_in_explicit_mode_and_shutdown(wisp, tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "add_sub"), tmp_path / "add_sub")
    with wisp.Server(str(tmp_path), onnx_engine="tract") as s:
        with pytest.raises(wisp.UnavailableError, match="explicit model load / unload"):
            s.unload("add_sub")
        assert [(m.name, m.state) for m in s.models()] == [("add_sub", "READY")]

    s = wisp.Server([str(tmp_path)], onnx_engine="tract", model_control_mode="explicit")
    assert not s.model_ready("add_sub")
    s.load("add_sub")
    assert s.model_ready("add_sub") and s.model_ready("add_sub", "1")
    out = s.infer("add_sub", {"INPUT0": np.ones((2, 16), np.float32),
                              "INPUT1": np.ones((2, 16), np.float32)}, version=1)
    assert out["OUTPUT0"].shape == (2, 16)
    s.unload("add_sub")
    assert not s.model_ready("add_sub")
    s.shutdown()
    with pytest.raises(wisp.UnavailableError, match="shut down"):
        s.models()
    with pytest.raises(wisp.InvalidArgumentError, match="model_control_mode"):
        wisp.Server(str(tmp_path), model_control_mode="sometimes")


def test_request_parameters_reach_the_server(both, wisp):
    inproc, _ = both
    x = {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
    assert "OUTPUT0" in inproc.infer("add_sub", x, parameters={"priority": 1, "timeout": 0})
    with pytest.raises(wisp.InvalidArgumentError, match="'priority' must be a non-negative integer"):
        inproc.infer("add_sub", x, parameters={"priority": "high"})
    with pytest.raises(wisp.InvalidArgumentError, match="parameter 'x': must be a bool, an int or a str"):
        inproc.infer("add_sub", x, parameters={"x": 1.5})
