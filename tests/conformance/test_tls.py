"""TLS with NVIDIA's own clients: tritonclient.http over HTTPS (server authenticated) and
tritonclient.grpc over TLS with mutual authentication, against certificates made at test time
(`wisp-test-certs`), on a `wisp` started with Triton's gRPC SSL flags and Wisp's HTTP ones."""
import os
import signal
import ssl
import subprocess
import tempfile
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, free_port


def add_sub_inputs(module):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a + b


@pytest.fixture(scope="module")
def tls_server():
    binary = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
    certs_bin = os.path.join(os.path.dirname(binary), "wisp-test-certs")
    d = tempfile.mkdtemp()
    subprocess.run([certs_bin, d], check=True)
    pem = lambda name: os.path.join(d, name)
    port, grpc_port = free_port(), free_port()
    log = open(os.path.join(ROOT, "target", "conformance-tls.log"), "w")
    proc = subprocess.Popen(
        [binary, "serve", "--model-repository", os.path.join(ROOT, "tests", "fixtures", "repo"),
         "--http-address", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(grpc_port),
         "--metrics-port", str(free_port()), "--onnx-engine", "tract",
         "--http-use-ssl=true", "--http-server-cert", pem("server.pem"), "--http-server-key", pem("server.key"),
         "--grpc-use-ssl=true", "--grpc-use-ssl-mutual=true", "--grpc-server-cert", pem("server.pem"),
         "--grpc-server-key", pem("server.key"), "--grpc-root-cert", pem("ca.pem")],
        stdout=log, stderr=subprocess.STDOUT,
    )
    ctx = ssl.create_default_context(cafile=pem("ca.pem"))
    deadline = time.time() + 60
    while True:
        try:
            c = httpclient.InferenceServerClient(
                f"localhost:{port}", ssl=True, ssl_context_factory=lambda: ctx)
            if c.is_server_ready():
                break
        except Exception:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"wisp did not become ready; see {log.name}")
        time.sleep(0.2)
    yield {"url": f"localhost:{port}", "grpc_url": f"localhost:{grpc_port}", "pem": pem, "ctx": ctx}
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert code == 0


def test_https_infer(tls_server):
    ctx = tls_server["ctx"]
    c = httpclient.InferenceServerClient(tls_server["url"], ssl=True, ssl_context_factory=lambda: ctx)
    assert c.is_server_live()
    inputs, want = add_sub_inputs(httpclient)
    r = c.infer("add_sub", inputs)
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), want)


def test_grpc_mutual_tls_infer(tls_server):
    pem = tls_server["pem"]
    c = grpcclient.InferenceServerClient(
        tls_server["grpc_url"], ssl=True, root_certificates=pem("ca.pem"),
        private_key=pem("client.key"), certificate_chain=pem("client.pem"))
    assert c.is_server_live()
    inputs, want = add_sub_inputs(grpcclient)
    r = c.infer("add_sub", inputs)
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), want)


def test_grpc_without_client_certificate_is_refused(tls_server):
    pem = tls_server["pem"]
    c = grpcclient.InferenceServerClient(tls_server["grpc_url"], ssl=True, root_certificates=pem("ca.pem"))
    with pytest.raises(Exception):
        c.is_server_live()


def test_untrusted_server_certificate_is_rejected(tls_server):
    c = httpclient.InferenceServerClient(
        tls_server["url"], ssl=True, ssl_context_factory=ssl.create_default_context)
    with pytest.raises(Exception):
        c.is_server_live()
