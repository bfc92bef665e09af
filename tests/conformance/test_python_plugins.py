"""Python plugins (plugins/python/, built with componentize-py by `./dev plugins`) served as
wasm models and called with NVIDIA's clients: a text normalizer that describes itself (no
config.pbtxt) and a BLS plugin that calls an ONNX model with its whole batch at once."""
import os
import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, start_wisp, stop_wisp

BUILT = os.path.join(ROOT, "plugins", "target", "python")


def component(name):
    path = os.path.join(BUILT, f"{name}.wasm")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: build the Python plugins with ./dev plugins")
    return path


@pytest.fixture(scope="module")
def python_plugins(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_repo")
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"),
                    os.path.join(repo, "add_sub"))
    os.makedirs(os.path.join(repo, "text_normalize", "1"))
    shutil.copy(component("text-normalize"), os.path.join(repo, "text_normalize", "1", "model.wasm"))
    os.makedirs(os.path.join(repo, "add_sub_bls", "1"))
    shutil.copy(component("add-sub-bls"), os.path.join(repo, "add_sub_bls", "1", "model.wasm"))
    shutil.copy(os.path.join(ROOT, "plugins", "python", "add-sub-bls", "config.pbtxt"),
                os.path.join(repo, "add_sub_bls", "config.pbtxt"))
    cache = tmp_path_factory.mktemp("wasm_cache")
    proc, log, urls = start_wisp(repo, "tract", "conformance-python.log",
                                 ["--wasm-cache-dir", str(cache)], ready_within=300)
    yield urls
    stop_wisp(proc, log)


def test_a_python_plugin_describes_itself_and_normalizes_text(python_plugins):
    c = httpclient.InferenceServerClient(url=python_plugins["url"])
    cfg = c.get_model_config("text_normalize")
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["name"] == "TEXT" and cfg["input"][0]["data_type"] == "TYPE_STRING"
    text = np.array([["  Ｈｅｌｌｏ\t WORLD ".encode()], ["ﬁne".encode()]], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    inp.set_data_from_numpy(text)
    out = c.infer("text_normalize", [inp]).as_numpy("NORMALIZED")
    assert [v.decode() for v in out.reshape(-1)] == ["hello world", "fine"]
    bad = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    bad.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=np.object_))
    with pytest.raises(Exception) as e:
        c.infer("text_normalize", [bad])
    assert "UTF-8" in str(e.value)


def test_a_python_bls_plugin_calls_a_model_with_its_batch(python_plugins):
    before = httpclient.InferenceServerClient(url=python_plugins["url"]).get_inference_statistics(
        "add_sub")["model_stats"][0]
    errors = []

    def one(i):
        try:
            c = grpcclient.InferenceServerClient(url=python_plugins["grpc_url"])
            a = np.full((1, 16), float(i), dtype=np.float32)
            b = np.ones((1, 16), dtype=np.float32)
            ins = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"),
                   grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            r = c.infer("add_sub_bls", ins)
            assert np.allclose(r.as_numpy("OUTPUT0"), a + b)
            assert np.allclose(r.as_numpy("OUTPUT1"), a - b)
            assert np.allclose(r.as_numpy("TOTAL"), [[16.0 * (i + 1)]])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    after = httpclient.InferenceServerClient(url=python_plugins["url"]).get_inference_statistics(
        "add_sub")["model_stats"][0]
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 16
