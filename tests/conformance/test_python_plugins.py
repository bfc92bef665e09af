"""Python plugins (plugins/python/, built with componentize-py by `./dev plugins`) served as
wasm models and called with NVIDIA's clients: a text normalizer that describes itself (no
config.pbtxt), a BLS plugin that calls an ONNX model with its whole batch at once, and a
decoupled plugin that streams its responses through `get_response_sender()`."""
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
    os.makedirs(os.path.join(repo, "repeat", "1"))
    shutil.copy(component("repeat"), os.path.join(repo, "repeat", "1", "model.wasm"))
    shutil.copy(os.path.join(ROOT, "plugins", "python", "repeat", "config.pbtxt"),
                os.path.join(repo, "repeat", "config.pbtxt"))
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


def test_a_decoupled_python_plugin_streams_through_its_response_sender(python_plugins):
    import json
    import queue

    import httpx
    import httpx_sse

    results = queue.Queue()
    c = grpcclient.InferenceServerClient(url=python_plugins["grpc_url"])
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        i = grpcclient.InferInput("IN", [3], "INT32")
        i.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
        c.async_stream_infer("repeat", [i], enable_empty_final_response=True)
        got = []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            if result.get_response().outputs:
                got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        c.stop_stream()
    assert got == [(7, 0), (8, 1), (9, 2)]
    with httpx.Client(timeout=60) as h:
        url = f"http://{python_plugins['url']}/v2/models/repeat/generate_stream"
        with httpx_sse.connect_sse(h, "POST", url, json={"IN": [1, 2]}) as events:
            got = [json.loads(e.data) for e in events.iter_sse()]
    assert [(e["OUT"], e["IDX"]) for e in got] == [(1, 0), (2, 1)]
