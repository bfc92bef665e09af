"""Triton's `file:` load parameters through NVIDIA's clients: a model shipped in the load
request (config plus model files) is served from a fresh server-owned directory, which goes
away on unload; paths outside a version directory, missing configs, bad encodings and
sandbox-widening plugin configs are refused."""
import base64
import glob
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ENGINES, ROOT, start_wisp, stop_wisp

ADD_SUB = os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub")
CONFIG = json.dumps({
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
})


@pytest.fixture(scope="module", params=ENGINES)
def explicit(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("override_repo")
    shutil.copytree(ADD_SUB, os.path.join(repo, "add_sub"))
    proc, log, urls = start_wisp(repo, request.param, f"conformance-override-{request.param}.log",
                                 ["--model-control-mode", "explicit", "--allow-unauthenticated-control",
                                  "--load-model", "add_sub"])
    yield urls
    stop_wisp(proc, log)


def model_bytes():
    with open(os.path.join(ADD_SUB, "1", "model.onnx"), "rb") as f:
        return f.read()


def shipped_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "wisp-override-*")))


def add_sub(mod, c, name):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return c.infer(name, inputs).as_numpy("OUTPUT0")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_shipped_in_the_load_request_serves_and_is_cleaned_up(explicit, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    c = mod.InferenceServerClient(url=explicit["url" if protocol == "http" else "grpc_url"])
    before = shipped_dirs()
    name = f"shipped_{protocol}"
    c.load_model(name, config=CONFIG, files={"file:1/model.onnx": model_bytes()})
    assert c.is_model_ready(name)
    np.testing.assert_allclose(add_sub(mod, c, name), 2 * np.arange(16).reshape(1, 16))
    assert len(shipped_dirs() - before) == 1, "one server-owned directory while it is loaded"
    # reloading with new files replaces the directory
    c.load_model(name, config=CONFIG, files={"file:1/model.onnx": model_bytes()})
    assert len(shipped_dirs() - before) == 1
    c.unload_model(name)
    assert shipped_dirs() - before == set(), "removed on unload"
    assert not c.is_model_ready(name)


def expect_refusal(fn, *words):
    with pytest.raises(InferenceServerException) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_shipments_are_refused(explicit):
    c = httpclient.InferenceServerClient(url=explicit["url"])
    before = shipped_dirs()
    onnx = model_bytes()
    for path in ["file:../escape.onnx", "file:config.pbtxt", "file:/tmp/x", "file:1/../../x",
                 "file:model.onnx"]:
        expect_refusal(lambda: c.load_model("bad", config=CONFIG, files={path: onnx}), path)
    expect_refusal(lambda: c.load_model("bad", files={"file:1/model.onnx": onnx}), "'config'")
    # a plugin config from the network may not grant what the repository does not
    wasm_config = json.dumps({
        "backend": "wasm", "max_batch_size": 0,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "parameters": {"wasm.allow_env": {"string_value": "HOME"}},
    })
    expect_refusal(lambda: c.load_model("bad", config=wasm_config, files={"file:1/model.wasm": b"\0asm"}),
                   "may not widen parameters.wasm.allow_env")
    # not base64, over the wire as Triton's JSON
    body = json.dumps({"parameters": {"config": CONFIG, "file:1/model.onnx": "***"}}).encode()
    req = urllib.request.Request(f"http://{explicit['url']}/v2/repository/models/bad/load", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and b"base64" in e.value.read()
    assert shipped_dirs() - before == set(), "nothing is left behind by a refused load"
    # the server still serves
    np.testing.assert_allclose(add_sub(httpclient, c, "add_sub"), 2 * np.arange(16).reshape(1, 16))


def test_a_failed_shipped_reload_keeps_the_old_version(explicit):
    c = httpclient.InferenceServerClient(url=explicit["url"])
    c.load_model("keeper", config=CONFIG, files={"file:1/model.onnx": model_bytes()})
    before = shipped_dirs()
    expect_refusal(lambda: c.load_model("keeper", config=CONFIG, files={"file:1/model.onnx": b"not onnx"}),
                   "failed to load 'keeper'")
    assert shipped_dirs() == before, "the failed shipment is removed, the serving one kept"
    np.testing.assert_allclose(add_sub(httpclient, c, "keeper"), 2 * np.arange(16).reshape(1, 16))
    c.unload_model("keeper")


def test_a_garbage_upload_does_not_make_the_server_unready(explicit):
    """Readiness as Triton's --strict-readiness has it: only live (ready) versions count, so a
    load request shipping a garbage model fails with its reason, the model is UNAVAILABLE, and
    /v2/health/ready still answers 200 (it used to answer 503 until the model was unloaded)."""
    c = httpclient.InferenceServerClient(url=explicit["url"])
    assert c.is_server_ready()
    expect_refusal(lambda: c.load_model("garbage", config=CONFIG, files={"file:1/model.onnx": b"not onnx"}),
                   "failed to load 'garbage'")
    assert not c.is_model_ready("garbage")
    assert c.is_server_ready()
    np.testing.assert_allclose(add_sub(httpclient, c, "add_sub"), 2 * np.arange(16).reshape(1, 16))
    c.unload_model("garbage")


def test_load_names_are_judged_as_triton_judges_them(explicit):
    """Triton's QA (`ModelNameValidationTest`): names that leave the repository are refused as
    path traversal; names with dots that do not are looked up, and a missing one fails in
    Triton's words, over both protocols."""
    for mod, key in ((grpcclient, "grpc_url"), (httpclient, "url")):
        c = mod.InferenceServerClient(url=explicit[key])
        for name in ["model123", "model.version1", "...", "..my_model", "model..1"]:
            with pytest.raises(InferenceServerException) as e:
                c.load_model(name)
            assert "path traversal characters" not in e.value.message(), name
            assert f"failed to load '{name}', failed to poll from model repository" in e.value.message()
    c = grpcclient.InferenceServerClient(url=explicit["grpc_url"])
    for name in ["../etc", "a/../b", "model/..", "..", "/etc/passwd", "model/subdir", "model/",
                 " ..", ".. "]:
        with pytest.raises(InferenceServerException) as e:
            c.load_model(name)
        assert "model name must not contain path traversal characters" in e.value.message(), name
    assert c.is_server_live()
