"""Starts the real `wisp` binary on the fixture repository for the tritonclient conformance
tests, and stops it with SIGTERM at the end (checking the clean exit).

Environment: `WISP_BIN` (the binary), `WISP_RUNNER` (a command it runs under, such as
`qemu-aarch64 -L /usr/aarch64-linux-gnu` for a cross-built one), `WISP_ENGINES` (the ONNX
engines to test, default `tract,onnxruntime`; an edge build has only `tract`) and
`WISP_READY_SECS` (how long start-up may take, default 60)."""
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The binary runs under a runner (qemu-user): slow, and not a native process.
EMULATED = bool(os.environ.get("WISP_RUNNER"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENGINES = os.environ.get("WISP_ENGINES", "tract,onnxruntime").split(",")


def wisp_command():
    """The command that runs `wisp`: `WISP_BIN`, under `WISP_RUNNER` if set."""
    binary = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
    return [*shlex.split(os.environ.get("WISP_RUNNER", "")), binary]


def env_args():
    """Flags every server a test starts gets from the environment:
    - under qemu-user (`WISP_RUNNER` set), no pooling allocator: qemu-user tracks every page of
      a reservation, so the pool's terabytes of PROT_NONE address space cost it gigabytes of
      real memory (24 GB, then the OOM killer, with 1000 slots); a real device pays nothing;
    - then whatever `WISP_ARGS` holds (for example `--wasm-compiler pulley`)."""
    emulated = ["--wasm-pooling", "false"] if EMULATED else []
    return emulated + shlex.split(os.environ.get("WISP_ARGS", ""))


# A plugin's deadline under qemu-user, for `init` and each `execute`, instead of its config's.
EMULATED_PLUGIN_DEADLINE_MS = 120000


def relax_plugin_deadlines(repo):
    """Gives each plugin model of the repository copy `repo` (a pathlib.Path) a 120-s deadline
    instead of its 5 s default. For qemu-user only: riscv64 runs plugins on Pulley, an
    interpreter itself interpreted there, and the tokenizer's `init` (0.9 s natively on Pulley)
    can take longer than 5 s; `text_direction_bls`'s one `execute` spans a model call."""
    for config in repo.glob("*/config.pbtxt"):
        if not list(config.parent.glob("*/model.wasm")):
            continue
        text = config.read_text()
        assert "wasm.timeout_ms" not in text, f"the test would override {config}'s own deadline"
        config.write_text(text + 'parameters { key: "wasm.timeout_ms" value { string_value: '
                          f'"{EMULATED_PLUGIN_DEADLINE_MS}" }} }}\n')


def start_wisp(repo, engine, log_name, extra_args=(), ready_within=None):
    """Starts `wisp serve` on `repo`; returns (process, log file, urls) once it is ready."""
    if ready_within is None:
        ready_within = float(os.environ.get("WISP_READY_SECS", "60"))
    port = free_port()
    grpc_port = free_port()
    log = open(os.path.join(ROOT, "target", log_name), "w")
    proc = subprocess.Popen(
        [*wisp_command(), "serve", "--model-repository", str(repo),
         "--http-address", "127.0.0.1", "--http-port", str(port), "--metrics-port", str(free_port()), "--grpc-port", str(grpc_port), "--onnx-engine", engine, *env_args(), *extra_args],
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


@pytest.fixture(scope="session", params=ENGINES)
def server(request):
    repo = os.path.join(ROOT, "tests", "fixtures", "repo")
    # Client shared memory is off by default (as in Triton 26.05): test_shared_memory needs it.
    proc, log, urls = start_wisp(repo, request.param, f"conformance-{request.param}.log",
                                 ["--allow-client-shm=true"])
    yield urls
    stop_wisp(proc, log)
