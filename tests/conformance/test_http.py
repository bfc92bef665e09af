"""Conformance with NVIDIA's real `tritonclient[http]`: the calls a Triton user makes, unchanged."""
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(url=server["url"])
    yield c
    c.close()


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "wisp"
    assert "binary_tensor_data" in meta["extensions"]
    assert "classification" in meta["extensions"]


def test_model_metadata_and_config(client, server):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    meta = client.get_model_metadata("add_sub")
    assert meta["name"] == "add_sub"
    assert meta["versions"] == ["1"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}
    assert meta["parameters"]["engine"] == server["engine"]
    cfg = client.get_model_config("classifier")
    assert cfg["max_batch_size"] == 4
    assert cfg["input"][0]["name"] == "x"
    assert cfg["output"][0]["label_filename"] == "labels.txt"


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer_add_sub(client, binary, compression):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    res = client.infer("add_sub", inputs, outputs=outputs, request_id="req-7",
                       request_compression_algorithm=compression)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    assert res.get_response()["id"] == "req-7"
    assert res.get_response()["model_version"] == "1"


def test_infer_all_datatypes_binary(client):
    types = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
             "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    inputs, data = [], {}
    for name, t in types.items():
        arr = (np.arange(8).reshape(2, 4) % 2).astype(t) if t is np.bool_ else np.arange(8).reshape(2, 4).astype(t)
        data[name] = arr
        i = httpclient.InferInput(f"IN_{name}", [2, 4], name)
        i.set_data_from_numpy(arr, binary_data=True)
        inputs.append(i)
    res = client.infer("dtypes", inputs)
    for name, arr in data.items():
        np.testing.assert_array_equal(res.as_numpy(f"OUT_{name}"), arr)


def test_infer_bytes(client):
    arr = np.array([[b"hello", b"w\xc3\xb6rld"]], dtype=np.object_)
    i = httpclient.InferInput("text", [1, 2], "BYTES")
    i.set_data_from_numpy(arr, binary_data=True)
    res = client.infer("strings", [i])
    np.testing.assert_array_equal(res.as_numpy("same"), arr)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bytes_with_nul_pass_both_engines_unchanged(client, server, proto):
    # Triton's QA (test_unicode_bytes, simple_*_string_infer_client) sends elements with NUL
    # bytes inside and at the end; each element's length is known, so ONNX Runtime gets it
    # whole (GetResizedStringTensorElementBuffer), not cut at the first NUL.
    import tritonclient.grpc as grpcclient
    mod = httpclient if proto == "http" else grpcclient
    c = client if proto == "http" else grpcclient.InferenceServerClient(url=server["grpc_url"])
    for pair in ([b"a\x00b", b"ok"], [b"\x00", b""], [b"{\xbc\x0e>\x00\x00\x00", b"\x00lead"]):
        if server["engine"] != "onnxruntime" and any(b"\xbc" in e for e in pair):
            continue  # tract strings are UTF-8 (see the next test)
        arr = np.array([pair], dtype=np.object_)
        i = mod.InferInput("text", [1, 2], "BYTES")
        i.set_data_from_numpy(arr)
        res = c.infer("strings", [i])
        np.testing.assert_array_equal(res.as_numpy("same"), arr)
        assert [bytes(e) for e in res.as_numpy("same")[0]] == pair
    assert client.is_server_live()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_bytes_that_are_not_utf8_pass_onnx_runtime_unchanged(client, server, proto):
    # Triton hands ONNX string tensors any bytes (a std::string holds them); tract's strings
    # must be UTF-8, so there it is a 400 naming the element, never a silently changed string.
    import tritonclient.grpc as grpcclient
    mod = httpclient if proto == "http" else grpcclient
    c = client if proto == "http" else grpcclient.InferenceServerClient(url=server["grpc_url"])
    arr = np.array([[b"ok", b"\xff\xfe\x80 latin-1: \xe9"]], dtype=np.object_)
    i = mod.InferInput("text", [1, 2], "BYTES")
    i.set_data_from_numpy(arr)
    if server["engine"] == "onnxruntime":
        res = c.infer("strings", [i])
        np.testing.assert_array_equal(res.as_numpy("same"), arr)
    else:
        with pytest.raises(InferenceServerException) as e:
            c.infer("strings", [i])
        assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert "BYTES element 1 is not UTF-8" in e.value.message()
    assert client.is_server_live()


def test_classification(client):
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    i = httpclient.InferInput("x", [2, 8], "FP32")
    i.set_data_from_numpy(x)
    out = httpclient.InferRequestedOutput("probs", class_count=3)
    res = client.infer("classifier", [i], outputs=[out])
    top = res.as_numpy("probs")
    assert top.shape == (2, 3)
    for row in top:
        scores = [float(s.decode().split(":")[0]) for s in row]
        assert scores == sorted(scores, reverse=True)
        assert all(s.decode().split(":")[2] in ("cat", "dog", "bird", "fish") for s in row)


def test_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("missing_model")
    assert e.value.status() == "404"
    assert "missing_model" in e.value.message()
    bad = httpclient.InferInput("INPUT0", [1, 15], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 15), dtype=np.float32))
    good = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    good.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [bad, good])
    assert e.value.status() == "400"
    assert "INPUT0" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [good])
    assert "INPUT0" in e.value.message()
    wrong_type = httpclient.InferInput("x", [1, 8], "INT32")
    wrong_type.set_data_from_numpy(np.zeros((1, 8), dtype=np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("classifier", [wrong_type])
    assert "expects 'FP32'" in e.value.message()
    assert client.is_server_live()


def test_statistics(client):
    a = np.zeros((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a, binary_data=True)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    client.infer("add_sub", inputs)
    stats = client.get_inference_statistics("add_sub", "1")
    s = stats["model_stats"][0]
    assert s["name"] == "add_sub" and s["version"] == "1"
    assert s["inference_stats"]["success"]["count"] == before + 1
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert any(b["batch_size"] == 1 for b in s["batch_stats"])
    all_stats = client.get_inference_statistics()
    assert {m["name"] for m in all_stats["model_stats"]} >= {"add_sub", "classifier"}


def test_schedule_policy_parameters(client):
    a = np.zeros((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    res = client.infer("add_sub", inputs, priority=1, timeout=10_000_000)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a)


def test_model_ready_is_false_for_unknown_models_and_versions(client):
    # Triton answers "not ready" (HTTP 400) rather than an error, so the client returns False.
    assert client.is_model_ready("missing_model") is False
    assert client.is_model_ready("add_sub", "9") is False
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("missing_model")
    assert "Request for unknown model: 'missing_model' is not found" in e.value.message()


def test_an_output_requested_twice_is_rejected(client):
    a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", [a, b], outputs=outputs)
    assert e.value.status() == "400"
    assert "output 'OUTPUT0' already exists in request" in e.value.message()


def post(server, path, body, headers=None):
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"http://{server['url']}{path}", data=body, headers=headers or {},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tritons_words_for_raw_inputs_versions_and_element_counts(client, server):
    # a raw binary body for a model with two inputs
    status, body = post(server, "/v2/models/add_sub/infer", np.ones(16, np.float32).tobytes(),
                        {"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert ("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
            "'add_sub' model configuration") in body["error"]
    # a version the model does not serve
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("add_sub", model_version="9")
    assert "requested model version is not available for model" in e.value.message()
    # a shape whose element count overflows int64
    import json
    req = {"inputs": [{"name": n, "shape": [4611686018427387904, 16], "datatype": "FP32",
                       "data": [0.0]} for n in ("INPUT0", "INPUT1")]}
    status, body = post(server, "/v2/models/add_sub/infer", json.dumps(req).encode())
    assert status == 400
    assert "causes total element count to exceed maximum size of" in body["error"], body
