"""Starts the real `wisp` binary on the fixture repository for the tritonclient conformance
tests, and stops it with SIGTERM at the end (checking the clean exit)."""
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_wisp(repo, engine, log_name, extra_args=(), ready_within=60):
    """Starts `wisp serve` on `repo`; returns (process, log file, urls) once it is ready."""
    binary = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
    port = free_port()
    grpc_port = free_port()
    log = open(os.path.join(ROOT, "target", log_name), "w")
    proc = subprocess.Popen(
        [binary, "serve", "--model-repository", str(repo),
         "--http-address", "127.0.0.1", "--http-port", str(port), "--metrics-port", str(free_port()), "--grpc-port", str(grpc_port), "--onnx-engine", engine, *extra_args],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"127.0.0.1:{port}"
    deadline = time.time() + ready_within
    while True:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"wisp did not become ready; see {log.name}")
        time.sleep(0.1)
    return proc, log, {"url": url, "grpc_url": f"127.0.0.1:{grpc_port}", "engine": engine}


def stop_wisp(proc, log):
    """SIGTERM, and the clean exit it must give."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert code == 0, f"wisp exited with {code} on SIGTERM"


@pytest.fixture(scope="session", params=["tract", "onnxruntime"])
def server(request):
    repo = os.path.join(ROOT, "tests", "fixtures", "repo")
    proc, log, urls = start_wisp(repo, request.param, f"conformance-{request.param}.log")
    yield urls
    stop_wisp(proc, log)
