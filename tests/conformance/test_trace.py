"""The trace extension through NVIDIA's clients: settings globally and per model over HTTP and
gRPC, and Triton's trace-file JSON for a plain model and for an ensemble (a child trace per
step)."""
import glob
import json
import os
import shutil
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start_wisp, stop_wisp

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "repo")
ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
"""
COMPUTE = ["QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    repo = tmp_path_factory.mktemp("trace_repo")
    shutil.copytree(os.path.join(FIXTURES, "add_sub"), os.path.join(repo, "add_sub"))
    os.makedirs(os.path.join(repo, "pipeline", "1"))
    with open(os.path.join(repo, "pipeline", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE)
    out = tmp_path_factory.mktemp("traces")
    trace_file = os.path.join(out, "trace.json")
    proc, log, urls = start_wisp(repo, "tract", "conformance-trace.log", [
        "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1", "--trace-config", "log-frequency=1"])
    urls["trace_file"] = trace_file
    yield urls
    stop_wisp(proc, log)


def traces(trace_file):
    objects = []
    for f in sorted(glob.glob(trace_file + ".*")):
        with open(f) as fh:
            objects.extend(json.load(fh))
    heads = {o["id"]: o for o in objects if "model_name" in o}
    stamps = {o["id"]: [t["name"] for t in o["timestamps"]] for o in objects if "timestamps" in o}
    return heads, stamps


def traces_after(trace_file, before, want):
    """Polls the trace files (a writer thread writes them) until `want(heads)` holds."""
    deadline = time.time() + 10
    while True:
        heads, stamps = traces(trace_file)
        fresh = {i: h for i, h in heads.items() if i not in before}
        if want(fresh) or time.time() > deadline:
            return fresh, stamps
        time.sleep(0.05)


def infer(model, url):
    c = httpclient.InferenceServerClient(url=url)
    a = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    c.infer(model, inputs)


def test_settings_over_http_and_grpc(traced):
    h = httpclient.InferenceServerClient(url=traced["url"])
    g = grpcclient.InferenceServerClient(url=traced["grpc_url"])
    s = h.get_trace_settings()
    assert s["trace_level"] == ["TIMESTAMPS"] and s["trace_rate"] == "1"
    assert s["trace_file"] == traced["trace_file"] and s["log_frequency"] == "1"
    gs = g.get_trace_settings(as_json=True)["settings"]
    assert gs["trace_rate"]["value"] == ["1"] and gs["trace_level"]["value"] == ["TIMESTAMPS"]
    # per model, then cleared back to the global value
    s = h.update_trace_settings(model_name="add_sub", settings={"trace_rate": "3"})
    assert s["trace_rate"] == "3"
    assert h.get_trace_settings()["trace_rate"] == "1"
    s = g.update_trace_settings(model_name="add_sub", settings={"trace_rate": None}, as_json=True)
    assert s["settings"]["trace_rate"]["value"] == ["1"]
    # what cannot change over the network
    for bad, word in [({"trace_file": "/tmp/elsewhere.json"}, "trace_file"),
                      ({"trace_level": ["TENSORS"]}, "TENSORS"),
                      ({"trace_mode": "opentelemetry"}, "opentelemetry"),
                      ({"trace_rate": "0"}, "trace_rate")]:
        with pytest.raises(InferenceServerException) as e:
            h.update_trace_settings(settings=bad)
        assert word in str(e.value)
    with pytest.raises(InferenceServerException):
        h.get_trace_settings(model_name="no_such_model")
    assert "trace" in h.get_server_metadata()["extensions"]


def test_a_request_is_traced_in_tritons_format(traced):
    before, _ = traces(traced["trace_file"])
    infer("add_sub", traced["url"])
    heads, stamps = traces_after(traced["trace_file"], before,
                                 lambda h: any(v["model_name"] == "add_sub" for v in h.values()))
    new = [i for i in heads if heads[i]["model_name"] == "add_sub"]
    assert len(new) == 1, heads
    names = stamps[new[0]]
    assert names[0] == "REQUEST_START" and names[-1] == "REQUEST_END", names
    assert [n for n in names if n in COMPUTE] == COMPUTE, names
    assert heads[new[0]]["model_version"] == 1


def test_an_ensemble_traces_each_step_as_a_child(traced):
    before, _ = traces(traced["trace_file"])
    infer("pipeline", traced["url"])
    heads, stamps = traces_after(traced["trace_file"], before,
                                 lambda h: any(v["model_name"] == "pipeline" for v in h.values()))
    parents = [i for i in heads if heads[i]["model_name"] == "pipeline"]
    assert len(parents) == 1
    children = [i for i in heads if heads[i].get("parent_id") == parents[0]]
    assert len(children) == 1 and heads[children[0]]["model_name"] == "add_sub"
    # The step asks for version -1 (the latest); its trace names the version that ran.
    assert heads[children[0]]["model_version"] == 1
    child = stamps[children[0]]
    assert child[0] == "REQUEST_START" and child[-1] == "REQUEST_END"
    assert [n for n in child if n in COMPUTE] == COMPUTE, child
