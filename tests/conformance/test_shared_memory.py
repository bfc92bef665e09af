"""The system shared memory extension through NVIDIA's clients and their own shm helpers:
inputs read from and outputs written to client-created regions over HTTP and gRPC, several
regions at once, status and unregister, and every wrong size, offset or name refused with a
clear error."""
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

PROTOCOLS = ["http", "grpc"]


def client_for(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(url=server["url"])
    return grpcclient, grpcclient.InferenceServerClient(url=server["grpc_url"])


@pytest.fixture
def regions(request):
    """Creates shm objects (name → handle) and destroys them after the test."""
    made = {}

    def make(name, size):
        key = f"/wisp_test_{name}_{os.getpid()}"
        made[name] = (shm.create_shared_memory_region(name, key, size), key)
        return made[name]

    yield make
    for handle, _ in made.values():
        shm.destroy_shared_memory_region(handle)


def data(rows=2):
    rng = np.random.default_rng(rows)
    return (rng.standard_normal((rows, 16)).astype(np.float32),
            rng.standard_normal((rows, 16)).astype(np.float32))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_and_outputs_in_shared_memory(server, regions, protocol):
    mod, c = client_for(server, protocol)
    a, b = data()
    n = a.nbytes
    (inp, inp_key), (out, out_key) = regions("in", 2 * n), regions("out", 2 * n + 64)
    shm.set_shared_memory_region(inp, [a, b])
    c.unregister_system_shared_memory()
    c.register_system_shared_memory("in", inp_key, 2 * n)
    c.register_system_shared_memory("out", out_key, 2 * n + 64)
    try:
        inputs = [mod.InferInput("INPUT0", [2, 16], "FP32"), mod.InferInput("INPUT1", [2, 16], "FP32")]
        inputs[0].set_shared_memory("in", n)
        inputs[1].set_shared_memory("in", n, offset=n)
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", n, offset=64)
        outputs[1].set_shared_memory("out", n, offset=64 + n)
        r = c.infer("add_sub", inputs, outputs=outputs)
        got = r.get_output("OUTPUT0")
        params = got["parameters"] if protocol == "http" else got.parameters
        if protocol == "http":
            assert params["shared_memory_region"] == "out"
            assert params["shared_memory_byte_size"] == n
        else:
            assert params["shared_memory_region"].string_param == "out"
            assert params["shared_memory_byte_size"].int64_param == n
        sums = shm.get_contents_as_numpy(out, np.float32, [2, 16], offset=64)
        diffs = shm.get_contents_as_numpy(out, np.float32, [2, 16], offset=64 + n)
        np.testing.assert_allclose(sums, a + b, rtol=1e-6)
        np.testing.assert_allclose(diffs, a - b, rtol=1e-6)
        status = c.get_system_shared_memory_status()
        names = [s["name"] for s in status] if protocol == "http" else list(status.regions)
        assert sorted(names) == ["in", "out"]
    finally:
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shared_memory_mixes_with_ordinary_tensors(server, regions, protocol):
    mod, c = client_for(server, protocol)
    a, b = data(3)
    (inp, key), = [regions("one", a.nbytes)]
    shm.set_shared_memory_region(inp, [a])
    c.register_system_shared_memory("one", key, a.nbytes)
    try:
        inputs = [mod.InferInput("INPUT0", [3, 16], "FP32"), mod.InferInput("INPUT1", [3, 16], "FP32")]
        inputs[0].set_shared_memory("one", a.nbytes)
        inputs[1].set_data_from_numpy(b)
        r = c.infer("add_sub", inputs)
        np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    finally:
        c.unregister_system_shared_memory("one")


def expect_error(fn, *words):
    with pytest.raises(InferenceServerException) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_sizes_offsets_and_names_are_refused(server, regions, protocol):
    mod, c = client_for(server, protocol)
    a, b = data()
    n = a.nbytes
    (inp, key), = [regions("small", n)]
    shm.set_shared_memory_region(inp, [a])
    expect_error(lambda: c.register_system_shared_memory("too_big", key, n + 1), "past the end")
    expect_error(lambda: c.register_system_shared_memory("bad_key", "not-a-key", 8), "shm object name")
    # Only keys under the allowed prefix (--shm-key-prefix, default "wisp") can be registered.
    expect_error(lambda: c.register_system_shared_memory("foreign", "/someone_elses", 8),
                 "--shm-key-prefix")
    expect_error(lambda: c.register_system_shared_memory("missing", "/wisp_no_such_object", 8),
                 "Unable to open shared memory region")
    c.register_system_shared_memory("small", key, n)
    try:
        expect_error(lambda: c.register_system_shared_memory("small", key, n), "already in manager")

        def run(offset=0, byte_size=n, region="small", out_size=None):
            inputs = [mod.InferInput("INPUT0", [2, 16], "FP32"), mod.InferInput("INPUT1", [2, 16], "FP32")]
            inputs[0].set_shared_memory(region, byte_size, offset=offset)
            inputs[1].set_data_from_numpy(b)
            outputs = None
            if out_size is not None:
                outputs = [mod.InferRequestedOutput("OUTPUT0")]
                outputs[0].set_shared_memory("small", out_size)
            return c.infer("add_sub", inputs, outputs=outputs)

        expect_error(lambda: run(offset=8), "INPUT0", "past its")
        expect_error(lambda: run(byte_size=n - 4), "INPUT0")
        expect_error(lambda: run(region="nowhere"), "Unable to find system shared memory region")
        expect_error(lambda: run(out_size=n - 4), "OUTPUT0", "more than the")
        # the server is still fine, and the region still works
        r = run()
        np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        c.unregister_system_shared_memory("small")
        expect_error(lambda: run(), "Unable to find system shared memory region")
    finally:
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_object_truncated_after_registration_is_refused_and_the_server_lives(server, regions, protocol):
    """The client owns the object: truncated to 0 under a registered 1 MiB region, inferring
    from it or into it is a clear error (it used to kill the server with SIGBUS)."""
    mod, c = client_for(server, protocol)
    a, b = data()
    size = 1 << 20
    (handle, key), = [regions("shrinks", size)]
    shm.set_shared_memory_region(handle, [a])
    c.register_system_shared_memory("shrinks", key, size)
    try:
        os.truncate("/dev/shm/" + key.lstrip("/"), 0)

        def run(read):
            inputs = [mod.InferInput("INPUT0", [2, 16], "FP32"), mod.InferInput("INPUT1", [2, 16], "FP32")]
            inputs[1].set_data_from_numpy(b)
            outputs = None
            if read:
                inputs[0].set_shared_memory("shrinks", a.nbytes)
            else:
                inputs[0].set_data_from_numpy(a)
                outputs = [mod.InferRequestedOutput("OUTPUT0")]
                outputs[0].set_shared_memory("shrinks", a.nbytes, offset=size // 2)
            return c.infer("add_sub", inputs, outputs=outputs)

        expect_error(lambda: run(True), "shrinks", "shrank to 0 bytes")
        expect_error(lambda: run(False), "shrinks", "shrank to 0 bytes")
        assert c.is_server_live()
        inputs = [mod.InferInput("INPUT0", [2, 16], "FP32"), mod.InferInput("INPUT1", [2, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        np.testing.assert_allclose(c.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    finally:
        c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shared_memory_is_refused_clearly(server, protocol):
    _, c = client_for(server, protocol)
    expect_error(lambda: c.get_cuda_shared_memory_status(), "CUDA shared memory is not supported")


def test_the_extension_is_listed(server):
    c = httpclient.InferenceServerClient(url=server["url"])
    assert "system_shared_memory" in c.get_server_metadata()["extensions"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_belongs_to_the_token_that_registered_it(server, regions, protocol):
    """With a `wisp-shm-token` header a region is the registering client's: another token, or
    no token, cannot infer from it, write into it, list it or unregister it."""
    mod, c = client_for(server, protocol)
    alice, bob = {"wisp-shm-token": f"alice-{protocol}"}, {"wisp-shm-token": f"bob-{protocol}"}
    a, b = data()
    n = a.nbytes
    inp, key = regions("mine", 2 * n)
    shm.set_shared_memory_region(inp, [a, b])
    c.register_system_shared_memory("mine", key, 2 * n, headers=alice)
    try:
        def infer(headers):
            inputs = [mod.InferInput("INPUT0", [2, 16], "FP32"),
                      mod.InferInput("INPUT1", [2, 16], "FP32")]
            inputs[0].set_shared_memory("mine", n)
            inputs[1].set_shared_memory("mine", n, offset=n)
            return c.infer("add_sub", inputs, headers=headers)

        assert np.allclose(infer(alice).as_numpy("OUTPUT0"), a + b)
        for other in (bob, None):
            expect_error(lambda: infer(other), "Unable to find system shared memory region: 'mine'")
            status = c.get_system_shared_memory_status(headers=other)
            names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
            assert "mine" not in names
            c.unregister_system_shared_memory("mine", headers=other)
            c.unregister_system_shared_memory(headers=other)
        assert np.allclose(infer(alice).as_numpy("OUTPUT0"), a + b), "still registered"
        expect_error(lambda: c.register_system_shared_memory(
            "bad", key, 8, headers={"wisp-shm-token": "has space"}), "wisp-shm-token")
    finally:
        c.unregister_system_shared_memory(headers=alice)
    expect_error(lambda: infer(alice), "Unable to find system shared memory region")
