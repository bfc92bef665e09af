"""Decoupled models (`model_transaction_policy { decoupled: true }`) through real clients:
tritonclient's gRPC stream (`triton_final_response`, `enable_empty_final_response`), the
generate extension over an SSE client (httpx-sse), Triton's refusals on HTTP infer and gRPC
ModelInfer, and what a client that goes away or stops reading can cost.

The models are wasm plugins: `testkit` in its `stream` mode (responses on request), and the
`vad_stream` example, which streams the `vad` model's per-frame speech probabilities for a
whole recording."""
import json
import os
import queue
import shutil
import socket
import time

import httpx
import httpx_sse
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start_wisp, stop_wisp

PLUGINS = os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release")

STREAM_CONFIG = """backend: "wasm"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "mode" value { string_value: "stream" } }
parameters { key: "wasm.timeout_ms" value { string_value: "%d" } }
"""


def plugin(repo, name, wasm, config):
    os.makedirs(os.path.join(repo, name, "1"))
    shutil.copy(os.path.join(PLUGINS, wasm), os.path.join(repo, name, "1", "model.wasm"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("decoupled"))
    plugin(repo, "stream", "plugin_testkit.wasm", STREAM_CONFIG % 30000)
    # one that gives up on a client that does not read within 2 s
    plugin(repo, "stream_short", "plugin_testkit.wasm", STREAM_CONFIG % 2000)
    # a plugin that calls the decoupled model, and an ensemble with it as a step
    plugin(repo, "caller", "plugin_testkit.wasm", STREAM_CONFIG.replace(
        "model_transaction_policy { decoupled: true }", "").replace(
        '"stream"', '"forward_each"') % 5000
        + 'parameters { key: "forward_to" value { string_value: "stream" } }\n')
    os.makedirs(os.path.join(repo, "ens", "1"))
    with open(os.path.join(repo, "ens", "config.pbtxt"), "w") as f:
        f.write("""platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "stream" model_version: -1
  input_map { key: "INPUT" value: "INPUT" } output_map { key: "OUTPUT" value: "OUTPUT" } } ] }
""")
    shutil.copytree(os.path.join(ROOT, "model_repo", "vad"), os.path.join(repo, "vad"))
    plugin(repo, "vad_stream", "plugin_vad_stream.wasm",
           open(os.path.join(ROOT, "model_repo", "vad_stream", "config.pbtxt")).read())
    proc, log, urls = start_wisp(repo, "onnxruntime", "conformance-decoupled.log",
                                 ["--strict-readiness=false"])
    yield urls
    stop_wisp(proc, log)


def int_input(mod, values=(1, 2)):
    i = mod.InferInput("INPUT", [2], "INT32")
    i.set_data_from_numpy(np.array(values, dtype=np.int32))
    return [i]


class Stream:
    """A tritonclient gRPC stream whose results land in a queue."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.results = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def until_final(self, timeout=30):
        """(outputs, errors) of one request, up to its `triton_final_response`."""
        outputs, errors = [], []
        deadline = time.time() + timeout
        while True:
            result, error = self.results.get(timeout=max(0.1, deadline - time.time()))
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            if response.outputs:
                outputs.append(result)
            if response.parameters["triton_final_response"].bool_param:
                return outputs, errors

    def close(self):
        self.client.stop_stream()
        self.client.close()


def test_grpc_stream_carries_every_response_and_the_final_flag(srv):
    s = Stream(srv["grpc_url"])
    try:
        params = {"count": 4}
        s.client.async_stream_infer("stream", int_input(grpcclient), request_id="r1",
                                    parameters=params, enable_empty_final_response=True)
        outputs, errors = s.until_final()
        assert errors == []
        got = [r.as_numpy("OUTPUT").tolist() for r in outputs]
        assert got == [[1, 2], [2, 3], [3, 4], [4, 5]]
        assert all(r.get_response().id == "r1" for r in outputs)
        flags = [r.get_response().parameters["triton_final_response"].bool_param for r in outputs]
        assert flags == [False] * 4, "the final flag came alone, after the responses"
        # the last response returned from execute carries the flag itself
        s.client.async_stream_infer("stream", int_input(grpcclient), request_id="r2",
                                    parameters={"count": 2, "end": "response"},
                                    enable_empty_final_response=True)
        outputs, _ = s.until_final()
        assert [r.as_numpy("OUTPUT").tolist() for r in outputs] == [[1, 2], [2, 3], [3, 4]]
        assert outputs[-1].get_response().parameters["triton_final_response"].bool_param
        # without enable_empty_final_response, the flag alone is not sent: just the responses
        s.client.async_stream_infer("stream", int_input(grpcclient), parameters={"count": 2})
        first, _ = s.results.get(timeout=30)
        second, _ = s.results.get(timeout=30)
        assert [first.as_numpy("OUTPUT").tolist(), second.as_numpy("OUTPUT").tolist()] == \
            [[1, 2], [2, 3]]
        with pytest.raises(queue.Empty):
            s.results.get(timeout=0.5)
    finally:
        s.close()


def test_grpc_stream_errors_arrive_in_place_and_the_stream_goes_on(srv):
    s = Stream(srv["grpc_url"])
    try:
        s.client.async_stream_infer("stream", int_input(grpcclient),
                                    parameters={"count": 3, "error_at": 1, "end": "error"},
                                    enable_empty_final_response=True)
        # the final error ends the request: collect until it (it carries the final flag)
        seen = []
        while len(seen) < 4:
            seen.append(s.results.get(timeout=30))
        errors = [str(e) for _, e in seen if e is not None]
        outputs = [r.as_numpy("OUTPUT").tolist() for r, e in seen if e is None]
        assert outputs == [[1, 2], [3, 4]]
        assert any("testkit: error at 1" in e for e in errors), errors
        assert any("the last response is an error" in e for e in errors), errors
        # the stream still serves
        s.client.async_stream_infer("stream", int_input(grpcclient), parameters={"count": 1},
                                    enable_empty_final_response=True)
        outputs, errors = s.until_final()
        assert [r.as_numpy("OUTPUT").tolist() for r in outputs] == [[1, 2]] and errors == []
    finally:
        s.close()


def test_one_response_endpoints_refuse_a_decoupled_model_with_tritons_words(srv):
    h = httpclient.InferenceServerClient(url=srv["url"])
    with pytest.raises(InferenceServerException) as e:
        h.infer("stream", int_input(httpclient))
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(e.value)
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/infer",
                   json={"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2],
                                     "data": [1, 2]}]})
    assert r.status_code == 501
    g = grpcclient.InferenceServerClient(srv["grpc_url"])
    with pytest.raises(InferenceServerException) as e:
        g.infer("stream", int_input(grpcclient))
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in \
        e.value.message()


def sse(url, path, body, timeout=30):
    """The events of one generate_stream call, parsed."""
    with httpx.Client(timeout=timeout) as c:
        with httpx_sse.connect_sse(c, "POST", f"http://{url}{path}", json=body) as events:
            assert events.response.status_code == 200
            assert events.response.headers["content-type"].startswith("text/event-stream")
            return [json.loads(e.data) for e in events.iter_sse()]


def test_generate_stream_sends_each_response_as_an_event(srv):
    events = sse(srv["url"], "/v2/models/stream/generate_stream",
                 {"INPUT": [5, 6], "parameters": {"count": 3}})
    assert [e["OUTPUT"] for e in events] == [[5, 6], [6, 7], [7, 8]]
    assert all(e["model_name"] == "stream" and e["model_version"] == "1" for e in events)
    # an error after the stream started is an event; the ones before it arrived
    events = sse(srv["url"], "/v2/models/stream/generate_stream",
                 {"INPUT": [5, 6], "count": 3, "error_at": 2})
    assert [e.get("OUTPUT") for e in events[:2]] == [[5, 6], [6, 7]]
    assert events[2] == {"error": "testkit: error at 2"}
    # a request that fails before the model answers is a plain JSON error with its status
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/generate_stream", json={"INPUT": [1]})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert "input 'INPUT'" in r.json()["error"]
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/generate_stream", json={"INPUT": [1, 2],
                   "parameters": {"nested": {"no": 1}}})
    assert r.status_code == 400 and "'nested'" in r.json()["error"]


def test_generate_answers_one_response(srv):
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/generate",
                   json={"INPUT": [5, 6], "count": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {"model_name": "stream", "model_version": "1", "OUTPUT": [5, 6]}
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/generate",
                   json={"INPUT": [5, 6], "count": 2})
    assert r.status_code == 501 and "use generate_stream" in r.json()["error"]


def test_vad_stream_streams_a_recordings_frames_in_order(srv):
    rate = 16000
    t = np.arange(2 * rate) / rate
    # a second of silence, then a second of a voiced-like tone
    audio = np.where(t < 1.0, 0.0, 0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    s = Stream(srv["grpc_url"])
    try:
        i = grpcclient.InferInput("AUDIO", [audio.size], "FP32")
        i.set_data_from_numpy(audio)
        s.client.async_stream_infer("vad_stream", [i], enable_empty_final_response=True)
        outputs, errors = s.until_final(timeout=60)
    finally:
        s.close()
    assert errors == []
    frames = [int(r.as_numpy("FRAME")[0]) for r in outputs]
    assert frames == list(range(-(-audio.size // 512)))
    grpc_probs = [float(r.as_numpy("PROBABILITY")[0]) for r in outputs]
    assert all(0.0 <= p <= 1.0 for p in grpc_probs)
    # the same recording over SSE gives the same numbers (one sequence per request: the
    # model's state starts afresh each time)
    events = sse(srv["url"], "/v2/models/vad_stream/generate_stream", {"AUDIO": audio.tolist()},
                 timeout=60)
    assert [e["FRAME"] for e in events] == frames
    np.testing.assert_allclose([e["PROBABILITY"] for e in events], grpc_probs, rtol=1e-5)


def test_a_client_that_goes_away_frees_the_instance(srv):
    """`forever` sends until its client has gone: closing the SSE connection must stop it at
    once (the one instance is then free), not after its 30 s deadline."""
    with httpx.Client(timeout=30) as c:
        with httpx_sse.connect_sse(c, "POST", f"http://{srv['url']}/v2/models/stream/generate_stream",
                                   json={"INPUT": [1, 2], "forever": True}) as events:
            it = events.iter_sse()
            for _ in range(5):
                assert "OUTPUT" in json.loads(next(it).data)
    started = time.time()
    r = httpx.post(f"http://{srv['url']}/v2/models/stream/generate",
                   json={"INPUT": [5, 6], "count": 1}, timeout=30)
    assert r.status_code == 200, r.text
    assert time.time() - started < 10


def test_a_client_that_stops_reading_costs_at_most_the_deadline(srv):
    """A client that sends a request and never reads: the model fills the bounded stream,
    waits until its 2 s deadline, fails, and its instance serves the next client."""
    host, port = srv["url"].split(":")
    body = json.dumps({"INPUT": [1, 2], "forever": True}).encode()
    stuck = socket.create_connection((host, int(port)))
    try:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"POST /v2/models/stream_short/generate_stream HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)
        started = time.time()
        r = httpx.post(f"http://{srv['url']}/v2/models/stream_short/generate",
                       json={"INPUT": [5, 6], "count": 1}, timeout=30)
        assert r.status_code == 200, r.text
        assert time.time() - started < 10
    finally:
        stuck.close()


def test_plugins_and_ensembles_cannot_call_a_decoupled_model(srv):
    h = httpclient.InferenceServerClient(url=srv["url"])
    with pytest.raises(InferenceServerException) as e:
        h.infer("caller", int_input(httpclient))
    assert "model 'stream' is decoupled" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        h.infer("ens", int_input(httpclient))
    assert "model 'stream' is decoupled" in str(e.value)
