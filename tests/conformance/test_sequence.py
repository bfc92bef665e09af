"""Sequence batching (stateful models) through NVIDIA's real clients: interleaved sequences
from several clients on both strategies, over HTTP, gRPC and a gRPC stream; control inputs;
a missing START; an idle sequence timing out."""
import os
import shutil
import queue
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ENGINES, ROOT, start_wisp, stop_wisp

REPO = os.path.join(ROOT, "tests", "fixtures", "sequence")
MODELS = ["accumulate_direct", "accumulate_oldest"]


@pytest.fixture(scope="module", params=ENGINES)
def seq(request):
    proc, log, urls = start_wisp(REPO, request.param, f"conformance-sequence-{request.param}.log")
    yield urls
    stop_wisp(proc, log)


def one(mod, value):
    i = mod.InferInput("INPUT", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [i]


def check(result, want_sum, seq_id, start, end):
    assert result.as_numpy("OUTPUT")[0][0] == pytest.approx(want_sum)
    assert result.as_numpy("CORRID_OUT")[0][0] == seq_id
    assert result.as_numpy("START_OUT")[0][0] == int(start)
    assert result.as_numpy("END_OUT")[0][0] == int(end)
    assert result.as_numpy("STATE_OUT") is None, "the state stays with the server"


def run_sequence(mod, url, model, seq_id, values, errors):
    try:
        c = mod.InferenceServerClient(url=url)
        total = 0.0
        for n, v in enumerate(values):
            start, end = n == 0, n == len(values) - 1
            r = c.infer(model, one(mod, v), sequence_id=seq_id, sequence_start=start, sequence_end=end)
            total += v
            check(r, total, seq_id, start, end)
    except Exception as e:  # reported by the test thread
        errors.append(f"{model} sequence {seq_id}: {e!r}")


@pytest.mark.parametrize("model", MODELS)
def test_interleaved_sequences_from_several_clients(seq, model):
    errors = []
    threads = []
    for k, (mod, url) in enumerate([(httpclient, seq["url"]), (grpcclient, seq["grpc_url"])] * 3):
        seq_id = 1000 + k
        values = [float(seq_id % 7 + i) for i in range(6)]
        threads.append(threading.Thread(target=run_sequence, args=(mod, url, model, seq_id, values, errors)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, errors


def test_a_grpc_stream_carries_a_sequence(seq):
    results = queue.Queue()
    c = grpcclient.InferenceServerClient(url=seq["grpc_url"])
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for n, v in enumerate([1.0, 2.0, 3.0]):
            c.async_stream_infer("accumulate_oldest", one(grpcclient, v), request_id=str(n),
                                 sequence_id=77, sequence_start=n == 0, sequence_end=n == 2,
                                 enable_empty_final_response=True)
        sums = []
        for n in range(3):
            result, error = results.get(timeout=30)
            assert error is None, f"{error.status()} {error.message()}"
            sums.append(float(result.as_numpy("OUTPUT")[0][0]))
            # each response carries its request's sequence flags, and is its request's last
            p = result.get_response().parameters
            assert p["sequence_id"].int64_param == 77
            assert p["sequence_start"].bool_param == (n == 0)
            assert p["sequence_end"].bool_param == (n == 2)
            assert p["triton_final_response"].bool_param
        assert sums == [1.0, 3.0, 6.0]
    finally:
        c.stop_stream()
        c.close()


def test_a_sequence_must_start_with_start(seq):
    c = httpclient.InferenceServerClient(url=seq["url"])
    with pytest.raises(InferenceServerException) as e:
        c.infer("accumulate_direct", one(httpclient, 1.0), sequence_id=4242)
    assert "must specify the START flag on the first request of the sequence" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        c.infer("accumulate_direct", one(httpclient, 1.0))
    assert "correlation ID" in str(e.value)
    g = grpcclient.InferenceServerClient(url=seq["grpc_url"])
    with pytest.raises(InferenceServerException) as e:
        g.infer("accumulate_direct", one(grpcclient, 1.0), sequence_id=4243)
    assert "START" in str(e.value)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_idle_sequence_times_out(seq):
    c = httpclient.InferenceServerClient(url=seq["url"])
    r = c.infer("accumulate_idle", one(httpclient, 5.0), sequence_id=9, sequence_start=True)
    assert r.as_numpy("OUTPUT")[0][0] == 5.0
    time.sleep(0.6)  # max_sequence_idle_microseconds is 0.2 s
    with pytest.raises(InferenceServerException) as e:
        c.infer("accumulate_idle", one(httpclient, 1.0), sequence_id=9)
    assert "START" in str(e.value)
    # started again, it begins from a zero state
    r = c.infer("accumulate_idle", one(httpclient, 2.0), sequence_id=9, sequence_start=True, sequence_end=True)
    assert r.as_numpy("OUTPUT")[0][0] == 2.0


def test_a_string_id_on_an_integer_corrid_model_is_refused(seq):
    c = httpclient.InferenceServerClient(url=seq["url"])
    with pytest.raises(InferenceServerException) as e:
        c.infer("accumulate_direct", one(httpclient, 1.0), sequence_id="abc", sequence_start=True,
                sequence_end=True)
    assert "correlation ID" in str(e.value)


def test_the_sequence_extension_and_config(seq):
    c = httpclient.InferenceServerClient(url=seq["url"])
    assert "sequence" in c.get_server_metadata()["extensions"]
    meta = c.get_model_metadata("accumulate_direct")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"], "controls and state are the server's"
    cfg = c.get_model_config("accumulate_oldest")
    assert cfg["sequence_batching"]["oldest"]["max_candidate_sequences"] == 4


VAD = os.path.join(ROOT, "model_repo", "vad")


@pytest.fixture(scope="module", params=["tract", "onnxruntime"])
def vad_server(request, tmp_path_factory):
    """The vad demo on each engine. tract runs it once its `If` nodes, whose conditions the
    fixed input shapes decide, are inlined at load: the answers below are ONNX Runtime's own."""
    engine = request.param
    if engine not in ENGINES:
        pytest.skip(f"this run leaves out {engine} (WISP_ENGINES)")
    assert os.path.isfile(os.path.join(VAD, "1", "model.onnx")), \
        "model_repo/vad/1/model.onnx is missing: run ./dev test (it fetches it)"
    repo = tmp_path_factory.mktemp("vad")
    shutil.copytree(VAD, os.path.join(repo, "vad"))
    proc, log, urls = start_wisp(repo, engine, f"conformance-vad-{engine}.log")
    yield urls
    stop_wisp(proc, log)


def vad_frames(seed, n):
    """n windows of 576 samples (64 of context + a 512-sample frame) of 16 kHz audio: quiet
    noise, then a voiced tone burst, then noise again."""
    rng = np.random.default_rng(seed)
    audio = rng.normal(0, 0.002, 64 + 512 * n).astype(np.float32)
    t = np.arange(audio.size) / 16000.0
    burst = slice(64 + 512 * (n // 3), 64 + 512 * (2 * n // 3))
    audio[burst] += (0.3 * np.sin(2 * np.pi * (140 + 60 * seed) * t[burst])
                     * (1 + 0.5 * np.sin(2 * np.pi * 3 * t[burst]))).astype(np.float32)
    return [audio[512 * k: 512 * k + 576].reshape(1, 576) for k in range(n)]


def vad_reference(frames):
    """The probabilities ONNX Runtime gives when the caller carries the state itself."""
    import onnxruntime as ort
    s = ort.InferenceSession(os.path.join(VAD, "1", "model.onnx"), providers=["CPUExecutionProvider"])
    h = np.zeros((1, 1, 128), dtype=np.float32)
    out = []
    for f in frames:
        p, h = s.run(["probability", "h_out"], {"audio_with_context": f, "h": h})
        out.append(float(p[0]))
    return out


def test_the_vad_demo_keeps_each_streams_state_on_the_server(vad_server):
    clips = {seq_id: vad_frames(seq_id, 24) for seq_id in (1, 2, 3)}
    want = {seq_id: vad_reference(frames) for seq_id, frames in clips.items()}
    got = {seq_id: [] for seq_id in clips}
    h = httpclient.InferenceServerClient(url=vad_server["url"])
    g = grpcclient.InferenceServerClient(url=vad_server["grpc_url"])
    try:
        # the three streams' frames interleaved, over both protocols
        for k in range(24):
            for seq_id, frames in clips.items():
                mod, c = (httpclient, h) if seq_id != 2 else (grpcclient, g)
                i = mod.InferInput("audio_with_context", [1, 576], "FP32")
                i.set_data_from_numpy(frames[k])
                r = c.infer("vad", [i], sequence_id=seq_id, sequence_start=k == 0, sequence_end=k == 23)
                got[seq_id].append(float(r.as_numpy("probability")[0]))
    finally:
        g.close()
    for seq_id in clips:
        np.testing.assert_allclose(got[seq_id], want[seq_id], atol=1e-5)
    # the bursts are heard: the state carried over is what makes the later frames confident
    assert max(want[1]) > 0.5 > min(want[1])
