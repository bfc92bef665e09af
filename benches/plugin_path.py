"""The plugin path: where a plugin request's server-side time goes, with a short call run on
the thread that received it (the default) against the same plugin kept on its instance's own
thread (`wasm.on_caller: false`), beside the ONNX add_sub on tract.

One `wisp serve` of one repository, so every model is measured by the same binary in the same
run: `add_sub` (ONNX, tract), `add_sub_rust` and `add_sub_rust_thread` (the Rust add/sub
plugin; the second with `wasm.on_caller: false`), and when their components are built
`add_sub_python` / `add_sub_python_thread` and `add_sub_js` (`--plugin NAME=WASM` adds another
build, `--only PREFIX` narrows the list). Each model gets `--requests` requests per round for
each protocol (HTTP with JSON over keep-alive connections, gRPC with tritonclient's binary
tensors) and each concurrency (1, 4 and 16 clients at once by default, the requests split
between them); rounds alternate the order of the models. From the statistics extension
(`/v2/models/<m>/stats`, before and after each load) it reports per request: queue and
compute_infer (Triton's figures), and the whole server-side request (queue + compute); from
the clients, p50 / p99 end to end and requests per second (Python clients: at c=16 the
clients' own CPU bounds the rate on two cores). The server's RSS when ready and after the
run is for all the models together (one process). Medians over the rounds.

    python benches/plugin_path.py --wisp target/release/wisp
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
]}).encode()
WASM_CONFIG = """backend: "wasm"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
OFF_CALLER = 'parameters { key: "wasm.on_caller" value { string_value: "false" } }\n'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_repo(repo, extra=(), only=None):
    """The models, by name; plugins whose components are not built are left out. `extra` adds
    (name, component) pairs served with the same config (another build of a plugin, to compare
    in one run); `only` keeps the models whose names start with one of its prefixes."""
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"),
                    os.path.join(repo, "add_sub"))
    models = ["add_sub"]
    target = os.path.join(ROOT, "plugins", "target")
    plugins = [
        ("add_sub_rust", os.path.join(target, "wasm32-wasip2", "release", "plugin_add_sub.wasm"), ""),
        ("add_sub_rust_thread", os.path.join(target, "wasm32-wasip2", "release", "plugin_add_sub.wasm"),
         OFF_CALLER),
        ("add_sub_python", os.path.join(target, "python", "add-sub.wasm"), ""),
        ("add_sub_python_thread", os.path.join(target, "python", "add-sub.wasm"), OFF_CALLER),
        ("add_sub_js", os.path.join(target, "js", "add-sub.wasm"), ""),
    ] + [(name, wasm, "") for name, wasm in extra]
    for name, wasm, params in plugins:
        if only and not any(name.startswith(p) for p in only):
            continue
        if not os.path.isfile(wasm):
            print(f"(left out: {name}, {wasm} is not built: ./dev plugins)", file=sys.stderr)
            continue
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copy(wasm, os.path.join(repo, name, "1", "model.wasm"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(WASM_CONFIG + params)
        models.append(name)
    return models


def serve(wisp, repo, engine="tract", extra=(), env=None, ready_secs=120, grpc_port=None):
    """Starts `wisp serve` on loopback and waits for readiness; returns (proc, HTTP port). The
    benches' one way to start a server (`extra`: more flags, `env`: the process environment,
    `grpc_port`: the gRPC port a caller will use, else a free one)."""
    port, grpc_port = free_port(), grpc_port or free_port()
    proc = subprocess.Popen(
        [wisp, "serve", "--model-repository", repo, "--http-address", "127.0.0.1",
         "--http-port", str(port), "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()),
         "--onnx-engine", engine, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + ready_secs
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"wisp ({engine}) did not become ready")


def stats(port, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", f"/v2/models/{model}/stats")
    s = json.loads(c.getresponse().read())["model_stats"][0]["inference_stats"]
    return {k: (int(s[k]["count"]), int(s[k]["ns"])) for k in ("success", "queue", "compute_infer")}


def client(port, model, n, lat):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", f"/v2/models/{model}/infer", BODY)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"{model} answered {r.status}")
        lat.append((time.perf_counter() - t) * 1e6)


def grpc_client(port, model, n, lat):
    import numpy as np
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = []
    for name, value in (("INPUT0", 2.0), ("INPUT1", 1.0)):
        t = grpcclient.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(np.full((1, 16), value, np.float32))
        inputs.append(t)
    for _ in range(n):
        t = time.perf_counter()
        c.infer(model, inputs)
        lat.append((time.perf_counter() - t) * 1e6)
    c.close()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024


def load(port, model, n, clients, proto="http", grpc_port=None):
    """`n` requests from each of `clients` clients over `proto` (gRPC to `grpc_port`); the
    statistics extension's per-request figures from the HTTP `port`, and the clients'."""
    before = stats(port, model)
    lats = [[] for _ in range(clients)]
    if proto == "grpc":
        target, where = grpc_client, grpc_port
    else:
        target, where = client, port
    threads = [threading.Thread(target=target, args=(where, model, n, lats[i]))
               for i in range(clients)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    after = stats(port, model)
    count = after["success"][0] - before["success"][0]
    per = {k: (after[k][1] - before[k][1]) / max(1, count) / 1e3 for k in ("queue", "compute_infer")}
    lat = sorted(x for l in lats for x in l)
    return {
        "queue": per["queue"],
        "compute_infer": per["compute_infer"],
        "server": per["queue"] + per["compute_infer"],
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "rps": len(lat) / wall,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="also write the markdown table here")
    ap.add_argument("--plugin", action="append", default=[], metavar="NAME=WASM",
                    help="also serve this component as NAME (e.g. a plugin's build before a change)")
    ap.add_argument("--only", action="append", metavar="PREFIX",
                    help="only the models whose names start with PREFIX (repeatable; add_sub is kept)")
    ap.add_argument("--protocols", default="http,grpc", help="http (JSON), grpc (binary), or both")
    ap.add_argument("--concurrency", default="1,4,16", help="clients at once, comma-separated")
    args = ap.parse_args()
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or any(p not in ("http", "grpc") for p in protocols):
        sys.exit("--protocols: http, grpc or http,grpc")
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if not concurrency or any(not 1 <= c <= 64 for c in concurrency):
        sys.exit("--concurrency: comma-separated counts from 1 to 64")
    extra = []
    for spec in args.plugin:
        name, sep, wasm = spec.partition("=")
        if not sep or not os.path.isfile(wasm):
            sys.exit(f"--plugin {spec}: expected NAME=WASM with an existing file")
        extra.append((name, os.path.abspath(wasm)))
    repo = tempfile.mkdtemp(prefix="wisp-plugin-path-")
    try:
        models = build_repo(repo, extra, args.only)
        grpc_port = free_port()
        proc, port = serve(args.wisp, repo, grpc_port=grpc_port)
        try:
            rss_ready = rss_mib(proc.pid)
            for m in models:  # warm-up: compiled code paged in, the moving average measured
                for proto in protocols:
                    load(port, m, 200, 1, proto, grpc_port)
            results = {(m, p, c): [] for m in models for p in protocols for c in concurrency}
            for r in range(args.rounds):
                order = models if r % 2 == 0 else list(reversed(models))
                for m in order:
                    for p in protocols:
                        for c in concurrency:
                            results[(m, p, c)].append(
                                load(port, m, max(1, args.requests // c), c, p, grpc_port))
            rss_end = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    lines = [
        f"`{args.wisp}`, {args.requests} requests per model, protocol and concurrency per round, "
        f"{args.rounds} rounds, medians (µs per request; req/s from the clients' wall time)",
        "",
        f"Server RSS (every model above loaded, one instance each): {rss_ready:.1f} MiB when ready, "
        f"{rss_end:.1f} MiB after the run.",
        "",
        "| model | protocol | c | queue | compute_infer | server-side | e2e p50 | e2e p99 | req/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (m, p, c), runs in results.items():
        med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        lines.append(f"| {m} | {p} | {c} | {med['queue']:.1f} | {med['compute_infer']:.1f} | "
                     f"{med['server']:.1f} | {med['p50']:.0f} | {med['p99']:.0f} | "
                     f"{med['rps']:.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
