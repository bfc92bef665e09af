"""The same add/sub step as a Rust, a Python and a JavaScript plugin (plugins/add-sub,
plugins/python/add-sub, plugins/js/add-sub), each describing itself (no config.pbtxt), served
beside the ONNX add_sub and giving the same answers through NVIDIA's clients."""
import os
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, start_wisp, stop_wisp

BUILT = {
    "add_sub_rust": os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release", "plugin_add_sub.wasm"),
    "add_sub_python": os.path.join(ROOT, "plugins", "target", "python", "add-sub.wasm"),
    "add_sub_js": os.path.join(ROOT, "plugins", "target", "js", "add-sub.wasm"),
}


@pytest.fixture(scope="module")
def languages(tmp_path_factory):
    repo = tmp_path_factory.mktemp("languages_repo")
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"),
                    os.path.join(repo, "add_sub"))
    for model, path in BUILT.items():
        if not os.path.isfile(path):
            pytest.fail(f"{path} is missing: build the plugins with ./dev plugins")
        os.makedirs(os.path.join(repo, model, "1"))
        shutil.copy(path, os.path.join(repo, model, "1", "model.wasm"))
    cache = tmp_path_factory.mktemp("wasm_cache")
    proc, log, urls = start_wisp(repo, "tract", "conformance-languages.log",
                                 ["--wasm-cache-dir", str(cache)], ready_within=300)
    yield urls
    stop_wisp(proc, log)


@pytest.mark.parametrize("model", ["add_sub", "add_sub_rust", "add_sub_python", "add_sub_js"])
def test_every_language_gives_the_same_answer(languages, model):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    h = httpclient.InferenceServerClient(url=languages["url"])
    if model != "add_sub":
        cfg = h.get_model_config(model)
        assert cfg["max_batch_size"] == 8 and [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    ins = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = h.infer(model, ins)
    assert np.allclose(r.as_numpy("OUTPUT0"), a + b) and np.allclose(r.as_numpy("OUTPUT1"), a - b)
    g = grpcclient.InferenceServerClient(url=languages["grpc_url"])
    gins = [grpcclient.InferInput("INPUT0", [3, 16], "FP32"), grpcclient.InferInput("INPUT1", [3, 16], "FP32")]
    gins[0].set_data_from_numpy(a)
    gins[1].set_data_from_numpy(b)
    out = [grpcclient.InferRequestedOutput("OUTPUT1")]
    r = g.infer(model, gins, outputs=out)
    assert np.allclose(r.as_numpy("OUTPUT1"), a - b) and r.as_numpy("OUTPUT0") is None
