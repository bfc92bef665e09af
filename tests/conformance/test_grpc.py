"""Conformance with NVIDIA's real `tritonclient[grpc]`: the calls a Triton user makes, unchanged."""
import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(url=server["grpc_url"])
    yield c
    c.close()


def add_sub_inputs(a, b):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "FP32"), grpcclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_and_metadata(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "wisp"
    assert "statistics" in meta["extensions"]
    assert client.is_model_ready("add_sub")
    m = client.get_model_metadata("add_sub", as_json=True)
    assert m["name"] == "add_sub"
    assert m["versions"] == ["1"]
    assert m["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}


def test_config(client):
    cfg = client.get_model_config("classifier", as_json=True)["config"]
    assert cfg["name"] == "classifier"
    assert int(cfg["max_batch_size"]) == 4
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["output"][0]["label_filename"] == "labels.txt"


def test_infer_raw_contents(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    res = client.infer("add_sub", add_sub_inputs(a, b), outputs=outputs, request_id="g-1")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    assert res.as_numpy("OUTPUT0") is None
    assert res.get_response().id == "g-1"


def test_infer_all_datatypes_and_bytes(client):
    types = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
             "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    inputs, data = [], {}
    for name, t in types.items():
        arr = (np.arange(8).reshape(2, 4) % 2).astype(t)
        data[name] = arr
        i = grpcclient.InferInput(f"IN_{name}", [2, 4], name)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    res = client.infer("dtypes", inputs)
    for name, arr in data.items():
        np.testing.assert_array_equal(res.as_numpy(f"OUT_{name}"), arr)
    s = np.array([[b"hello", b"w\xc3\xb6rld"]], dtype=np.object_)
    i = grpcclient.InferInput("text", [1, 2], "BYTES")
    i.set_data_from_numpy(s)
    np.testing.assert_array_equal(client.infer("strings", [i]).as_numpy("same"), s)


def test_classification(client):
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    i = grpcclient.InferInput("x", [1, 8], "FP32")
    i.set_data_from_numpy(x)
    res = client.infer("classifier", [i], outputs=[grpcclient.InferRequestedOutput("probs", class_count=2)])
    top = res.as_numpy("probs")
    assert top.shape == (1, 2)
    assert top[0][0].decode().split(":")[2] in ("cat", "dog", "bird", "fish")


def test_streaming(client):
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for k in range(3):
        a = np.full((1, 16), k, dtype=np.float32)
        client.async_stream_infer("add_sub", add_sub_inputs(a, a), request_id=str(k))
    got = {}
    for _ in range(3):
        result, error = results.get(timeout=30)
        assert error is None
        got[result.get_response().id] = result.as_numpy("OUTPUT0")[0][0]
    client.stop_stream()
    assert got == {"0": 0.0, "1": 2.0, "2": 4.0}


def test_statistics(client):
    a = np.zeros((1, 16), dtype=np.float32)
    client.infer("add_sub", add_sub_inputs(a, a))
    s = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert s["name"] == "add_sub"
    assert int(s["inference_stats"]["success"]["count"]) >= 1


def test_repository_index_and_control_mode(client):
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} >= {"add_sub", "classifier", "dtypes"}
    assert all(m["state"] == "READY" for m in index)
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("add_sub")
    assert "explicit" in e.value.message()
    assert client.is_model_ready("add_sub")


def test_log_settings(client):
    s = client.get_log_settings(as_json=True)["settings"]
    assert s["log_verbose_level"]["uint32_param"] == 0
    s = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert s["log_verbose_level"]["uint32_param"] == 1
    client.update_log_settings({"log_verbose_level": 0})


def test_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("missing_model")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    bad = np.zeros((1, 15), dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(bad, np.zeros((1, 16), dtype=np.float32)))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT0" in e.value.message()
    assert client.is_server_live()


def test_model_ready_is_false_for_unknown_models_and_versions(client):
    # Triton answers ModelReady with ready=false and status OK: no exception.
    assert client.is_model_ready("missing_model") is False
    assert client.is_model_ready("add_sub", "9") is False
    assert client.is_model_ready("add_sub") is True


def test_an_output_requested_twice_is_rejected(client):
    z = np.zeros((1, 16), dtype=np.float32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(z, z), outputs=outputs)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "output 'OUTPUT0' already exists in request" in e.value.message()


def test_a_bytes_count_mismatch_is_worded_as_triton_words_it(server):
    import struct
    c = grpcclient.InferenceServerClient(url=server["grpc_url"])
    x = grpcclient.InferInput("text", [1, 2], "BYTES")
    x.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    x._raw_content = b"".join(struct.pack("<I", 1) + s for s in (b"a", b"b", b"c"))
    with pytest.raises(InferenceServerException) as e:
        c.infer("strings", [x])
    # Triton's QA (InputShapeTest.test_input_string_shape_validation) checks both wordings
    assert ("unexpected number of string elements 3 for inference input 'text' for model "
            "'strings', expecting 2" in e.value.message())
    x._raw_content = struct.pack("<I", 1) + b"a"
    with pytest.raises(InferenceServerException) as e:
        c.infer("strings", [x])
    assert ("expected 2 string elements for inference input 'text' for model 'strings', got 1"
            in e.value.message())
