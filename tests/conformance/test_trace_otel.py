"""Triton's OpenTelemetry trace mode: spans exported over OTLP/HTTP to a collector the test
runs on loopback, Triton's span layout (InferRequest > model > compute, ensemble steps under
the ensemble), and W3C `traceparent` propagation from tritonclient over HTTP and gRPC."""
import os
import secrets
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start_wisp, stop_wisp
from test_trace import ENSEMBLE

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "repo")
COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


class Collector:
    """An OTLP/HTTP traces receiver: keeps every span it is sent, with its resource."""

    def __init__(self):
        self.spans = []
        self.requests = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and \
                    self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    req = trace_service_pb2.ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with collector.lock:
                        collector.requests += 1
                        for rs in req.resource_spans:
                            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                            for ss in rs.scope_spans:
                                for span in ss.spans:
                                    collector.spans.append((resource, span))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self):
        with self.lock:
            return list(self.spans)

    def wait_for(self, want, timeout=10):
        """Polls until `want(spans)` holds; returns the spans (the last ones seen on timeout)."""
        deadline = time.time() + timeout
        while True:
            spans = [s for _, s in self.snapshot()]
            if want(spans) or time.time() > deadline:
                return spans
            time.sleep(0.05)


@pytest.fixture(scope="module")
def otel(tmp_path_factory):
    repo = tmp_path_factory.mktemp("otel_repo")
    shutil.copytree(os.path.join(FIXTURES, "add_sub"), os.path.join(repo, "add_sub"))
    os.makedirs(os.path.join(repo, "pipeline", "1"))
    with open(os.path.join(repo, "pipeline", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE)
    collector = Collector()
    proc, log, urls = start_wisp(repo, "tract", "conformance-trace-otel.log", [
        "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1",
        "--trace-config", f"opentelemetry,url={collector.url}",
        "--trace-config", "opentelemetry,resource=service.name=wisp-conformance",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50"])
    urls["collector"] = collector
    yield urls
    stop_wisp(proc, log)
    collector.server.shutdown()


def inputs(module):
    a = np.ones((1, 16), dtype=np.float32)
    ins = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    return ins


def new_context():
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def attrs(span):
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def in_trace(spans, trace_id):
    return [s for s in spans if s.trace_id.hex() == trace_id]


def check_request(spans, trace_id, parent_span_id, model):
    """Triton's layout for one plain request under the client's span."""
    mine = in_trace(spans, trace_id)
    by_name = {s.name: s for s in mine}
    assert set(by_name) == {"InferRequest", model, "compute"}, [s.name for s in mine]
    top, m, c = by_name["InferRequest"], by_name[model], by_name["compute"]
    assert top.parent_span_id.hex() == parent_span_id, "under the client's span"
    assert m.parent_span_id == top.span_id and c.parent_span_id == m.span_id
    a = attrs(m)
    assert a["triton.model_name"] == model and a["triton.model_version"] == 1, a
    assert "triton.trace_id" in a
    events = [e.name for e in m.events]
    assert events[0] == "REQUEST_START" and events[-1] == "REQUEST_END", events
    assert "QUEUE_START" in events, events
    assert [e.name for e in c.events] == COMPUTE
    assert top.start_time_unix_nano <= m.start_time_unix_nano <= c.start_time_unix_nano
    assert c.end_time_unix_nano <= m.end_time_unix_nano <= top.end_time_unix_nano
    return a


def test_an_http_request_is_exported_under_the_clients_span(otel):
    trace_id, span_id, headers = new_context()
    c = httpclient.InferenceServerClient(url=otel["url"])
    c.infer("add_sub", inputs(httpclient), headers=headers, request_id="req-7")
    spans = otel["collector"].wait_for(lambda s: len(in_trace(s, trace_id)) >= 3)
    a = check_request(spans, trace_id, span_id, "add_sub")
    assert a["triton.request_id"] == "req-7"
    resources = [r for r, s in otel["collector"].snapshot() if s.trace_id.hex() == trace_id]
    assert resources[0]["service.name"] == "wisp-conformance"


def test_a_grpc_request_carries_its_context_in_metadata(otel):
    trace_id, span_id, headers = new_context()
    c = grpcclient.InferenceServerClient(url=otel["grpc_url"])
    c.infer("add_sub", inputs(grpcclient), headers=headers)
    spans = otel["collector"].wait_for(lambda s: len(in_trace(s, trace_id)) >= 3)
    check_request(spans, trace_id, span_id, "add_sub")


def test_an_ensemble_step_is_a_model_span_under_the_ensembles(otel):
    trace_id, span_id, headers = new_context()
    c = httpclient.InferenceServerClient(url=otel["url"])
    c.infer("pipeline", inputs(httpclient), headers=headers)
    spans = otel["collector"].wait_for(lambda s: len(in_trace(s, trace_id)) >= 4)
    mine = in_trace(spans, trace_id)
    names = sorted(s.name for s in mine)
    assert names == ["InferRequest", "add_sub", "compute", "pipeline"], names
    by_name = {s.name: s for s in mine}
    ens, step = by_name["pipeline"], by_name["add_sub"]
    assert step.parent_span_id == ens.span_id
    assert by_name["compute"].parent_span_id == step.span_id
    assert attrs(step)["triton.trace_parent_id"] == attrs(ens)["triton.trace_id"]
    assert attrs(step)["triton.model_version"] == 1, "the version that ran the step"


def test_sampled_requests_without_a_context_get_a_trace_of_their_own(otel):
    before = {s.trace_id for _, s in otel["collector"].snapshot()}
    c = httpclient.InferenceServerClient(url=otel["url"])
    c.infer("add_sub", inputs(httpclient))
    spans = otel["collector"].wait_for(
        lambda s: any(x.name == "InferRequest" and x.trace_id not in before for x in s))
    fresh = [s for s in spans if s.trace_id not in before]
    top = [s for s in fresh if s.name == "InferRequest"]
    assert len(top) == 1 and top[0].parent_span_id == b"", "a root span"


def test_rate_zero_traces_only_requests_with_a_context(otel):
    h = httpclient.InferenceServerClient(url=otel["url"])
    h.update_trace_settings(model_name="add_sub", settings={"trace_rate": "0"})
    try:
        before = {s.trace_id for _, s in otel["collector"].snapshot()}
        h.infer("add_sub", inputs(httpclient))
        trace_id, span_id, headers = new_context()
        h.infer("add_sub", inputs(httpclient), headers=headers)
        spans = otel["collector"].wait_for(lambda s: len(in_trace(s, trace_id)) >= 3)
        check_request(spans, trace_id, span_id, "add_sub")
        time.sleep(0.3)
        fresh = {s.trace_id for _, s in otel["collector"].snapshot()} - before
        assert fresh == {bytes.fromhex(trace_id)}, "the request without a context was not traced"
    finally:
        h.update_trace_settings(model_name="add_sub", settings={"trace_rate": None})


def test_a_malformed_traceparent_is_ignored(otel):
    before = {s.trace_id for _, s in otel["collector"].snapshot()}
    c = httpclient.InferenceServerClient(url=otel["url"])
    bad = "00-" + "0" * 32 + "-" + "ab" * 8 + "-01"
    c.infer("add_sub", inputs(httpclient), headers={"traceparent": bad})
    spans = otel["collector"].wait_for(
        lambda s: any(x.name == "InferRequest" and x.trace_id not in before for x in s))
    top = [s for s in spans if s.name == "InferRequest" and s.trace_id not in before]
    assert len(top) == 1 and top[0].parent_span_id == b"" and top[0].trace_id != bytes(16)


def test_settings_report_the_mode_and_keep_it(otel):
    h = httpclient.InferenceServerClient(url=otel["url"])
    s = h.get_trace_settings()
    assert s["trace_mode"] == "opentelemetry" and s["trace_level"] == ["TIMESTAMPS"]
    g = grpcclient.InferenceServerClient(url=otel["grpc_url"])
    assert g.get_trace_settings(as_json=True)["settings"]["trace_mode"]["value"] == ["opentelemetry"]
    with pytest.raises(InferenceServerException) as e:
        h.update_trace_settings(settings={"trace_mode": "triton"})
    assert "trace_mode" in str(e.value)
