"""The edge benchmark: for each wisp binary given, its stripped size, start to ready and memory
serving the whole demo repository on tract (plugin cache cold, then warm), and demo-pipeline
throughput.

    python benches/edge.py [--label L] [--runner CMD] [--args FLAGS] BINARY [...]

`--runner` runs the binary under an emulator (`qemu-aarch64 -L /usr/aarch64-linux-gnu`): its
figures are labelled as emulated by the caller and say nothing absolute about real hardware,
only about relative regressions. `--args` adds flags to that binary's `wisp serve` (e.g.
`--wasm-compiler pulley`, to compare plugin compilers side by side). Under qemu-user the memory is the emulator's process, which
includes its translated code. Run through `./dev bench edge [TARGET...]` or
`./dev cross TARGET bench`, which build the binaries first.

The server loads all of `model_repo/` (the stateful `vad` and the embeddings pipeline, whose
encoder is 87 MB, included), as the edge quick start does; throughput is measured on the
`text_direction` and `content_type` pipelines. "RSS after start" is once ready (2 s after),
"RSS after the examples" after the throughput runs (tract's per-batch-size plans and buffers
stay allocated). Warm starts: 3 natively, 1 under a runner (`--warm-runs N`). Under a runner
the repository is a copy whose plugins have the emulated tests' 120-s deadline.
"""
import os
import pathlib
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))
CLIENTS = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start(cmd, repo, cache, log, extra):
    port = free_port()
    args = [*cmd, "serve", "--model-repository", repo,
            "--http-address", "127.0.0.1", "--http-port", str(port),
            "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
            "--onnx-engine", "tract", "--wasm-cache-dir", cache]
    if len(cmd) > 1:
        # Under qemu-user: its page tracking makes the pooling allocator's address-space
        # reservation cost real gigabytes (see tests/conformance/conftest.py).
        args += ["--wasm-pooling", "false"]
    args += extra
    began = time.monotonic()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url, time.monotonic() - began
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - began > 900:
            proc.kill()
            raise RuntimeError(f"{cmd} did not become ready; see {log.name}")
        time.sleep(0.005)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def throughput(url, model, name, payloads, seconds):
    """Requests per second from CLIENTS threads, each cycling through `payloads`."""
    import numpy as np
    import tritonclient.http as httpclient

    done = []
    deadline = time.monotonic() + seconds

    def client(k):
        c = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=600)
        n = 0
        while time.monotonic() < deadline:
            inp = httpclient.InferInput(name, [1, 1], "BYTES")
            data = payloads[(k + n) % len(payloads)]
            inp.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
            c.infer(model, [inp])
            n += 1
        done.append(n)

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - began)


def stripped_size(binary, runner):
    """The binary's size once stripped (the edge profile strips already)."""
    strip = "strip"
    if runner:
        # qemu-aarch64 -L /usr/aarch64-linux-gnu → aarch64-linux-gnu-strip
        sysroot = shlex.split(runner)[-1]
        strip = f"{os.path.basename(sysroot)}-strip"
    with tempfile.TemporaryDirectory() as d:
        copy = os.path.join(d, "wisp")
        shutil.copy(binary, copy)
        subprocess.run([strip, copy], check=True)
        return os.path.getsize(copy)


def measure(label, binary, runner, extra, seconds, warm_runs):
    from test_edge import FILES, IMAGES

    cmd = [*shlex.split(runner or ""), binary]
    images = [open(os.path.join(IMAGES, f), "rb").read()
              for f in ["text_upright.png", "text_rotated.png"]]
    files = list(FILES.values())
    row = {"label": label, "size_mb": stripped_size(binary, runner) / 1e6}
    with tempfile.TemporaryDirectory() as cache:
        log = open(os.path.join(ROOT, "target", "edge-bench.log"), "w")
        repo = os.path.join(ROOT, "model_repo")
        if runner:
            # As the emulated tests do: each plugin gets a 120-s deadline (the tokenizer's
            # init passes 5 s under qemu riscv64, where Pulley is itself interpreted).
            from conftest import relax_plugin_deadlines

            copy = pathlib.Path(cache) / "model_repo"
            shutil.copytree(repo, copy)
            relax_plugin_deadlines(copy)
            repo = str(copy)
        proc, _, cold = start(cmd, repo, cache, log, extra)
        stop(proc)
        ready, rss = [], []
        for i in range(warm_runs):
            proc, url, took = start(cmd, repo, cache, log, extra)
            ready.append(took)
            time.sleep(2)
            rss.append(rss_kib(proc.pid) / 1024)
            if i == warm_runs - 1:
                row["text_direction_rps"] = throughput(url, "text_direction", "IMAGE", images, seconds)
                row["content_type_rps"] = throughput(url, "content_type", "CONTENT", files, seconds)
                row["rss_after_load_mb"] = rss_kib(proc.pid) / 1024
            stop(proc)
        log.close()
    row.update(cold_ready_s=cold, ready_s=statistics.median(ready), idle_rss_mb=statistics.median(rss),
               warm_runs=warm_runs)
    return row


def main():
    runs, label, runner, extra, seconds, warm_runs = [], None, None, [], None, None
    rest = sys.argv[1:]
    if not rest or rest[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(2)
    while rest:
        arg = rest.pop(0)
        if arg == "--label":
            label = rest.pop(0)
        elif arg == "--runner":
            runner = rest.pop(0)
        elif arg == "--args":
            extra = shlex.split(rest.pop(0))
        elif arg == "--seconds":
            # throughput run per pipeline (default 10 s natively, 30 s emulated)
            seconds = float(rest.pop(0))
        elif arg == "--warm-runs":
            warm_runs = max(1, int(rest.pop(0)))
        else:
            runs.append((label or os.path.basename(os.path.dirname(arg)), arg, runner, extra))
            label, runner, extra = None, None, []
    rows = []
    for label, binary, runner, extra in runs:
        print(f"edge bench: {label} ({binary})", file=sys.stderr, flush=True)
        rows.append(measure(label, binary, runner, extra, seconds or (30 if runner else 10),
                            warm_runs or (1 if runner else 3)))
    print("| build | stripped size | start to ready, warm cache (median of runs) | cold start "
          "| RSS after start (median) | RSS after the examples | text_direction req/s | content_type req/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {r['size_mb']:.1f} MB | {r['ready_s']:.2f} s ({r['warm_runs']}) | {r['cold_ready_s']:.2f} s "
              f"| {r['idle_rss_mb']:.1f} MiB | {r['rss_after_load_mb']:.1f} MiB "
              f"| {r['text_direction_rps']:.1f} | {r['content_type_rps']:.1f} |")


if __name__ == "__main__":
    main()
