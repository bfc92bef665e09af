"""add_sub's latency while 16 plugin instances spin, with and without Triton's rate limiter.

One repository: `add_sub` (tract, one instance) and `spin`, the testkit plugin in `loop` mode
with 16 instances, each request spinning until its 100 ms deadline. Each spin instance asks for
one unit of resource HEAVY (`instance_group { rate_limiter { ... } }`); add_sub asks for
nothing. Three phases in one run, each on a fresh `wisp serve`:

- idle: add_sub alone;
- spinning: 16 clients keep all 16 spin instances busy, no rate limiter (Wisp's default, as
  Triton's);
- spinning, limited: the same under `--rate-limit execution_count --rate-limit-resource
  HEAVY:N` (N = the cores here less one): at most N spin instances execute at once, so a core
  stays free for add_sub. (The limiter cannot preempt: had add_sub to queue for a unit that
  spinners hold, it would wait for one of them to finish.)

Reports add_sub's p50 / p99 / max over sequential requests for `--seconds`, and the spin
requests finished (each ends at its deadline, as an error) per second.

    python benches/ratelimit.py --wisp target/release/wisp --testkit plugins/target/.../plugin_testkit.wasm
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benches"))
import plugin_path as pp  # noqa: E402

ADD_SUB = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
]}).encode()
SPIN = json.dumps({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}).encode()
LIMITER = 'rate_limiter { resources [ { name: "HEAVY" count: 1 } ] priority: 1 }'


def build_repo(repo, testkit):
    add_sub = os.path.join(repo, "add_sub")
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"), add_sub)
    with open(os.path.join(add_sub, "config.pbtxt"), "a") as f:
        f.write("\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n")
    spin = os.path.join(repo, "spin")
    os.makedirs(os.path.join(spin, "1"))
    shutil.copy(testkit, os.path.join(spin, "1", "model.wasm"))
    with open(os.path.join(spin, "config.pbtxt"), "w") as f:
        f.write(f"""backend: "wasm"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 2 ] }} ]
parameters {{ key: "mode" value: {{ string_value: "loop" }} }}
parameters {{ key: "wasm.timeout_ms" value: {{ string_value: "100" }} }}
instance_group [ {{ count: 16 kind: KIND_CPU {LIMITER} }} ]
""")


def spinner(port, stop, done):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        c.request("POST", "/v2/models/spin/infer", SPIN)
        c.getresponse().read()
        done.append(1)


def phase(wisp, repo, extra, spinners, seconds):
    proc, port = pp.serve(wisp, repo, extra=extra, ready_secs=60)
    stop = threading.Event()
    done = []
    threads = [threading.Thread(target=spinner, args=(port, stop, done)) for _ in range(spinners)]
    for t in threads:
        t.start()
    time.sleep(1.0 if spinners else 0)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat = []
    started = len(done)
    t0 = time.time()
    while time.time() - t0 < seconds:
        s = time.perf_counter()
        c.request("POST", "/v2/models/add_sub/infer", ADD_SUB)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"add_sub answered {r.status}")
        lat.append((time.perf_counter() - s) * 1000)
    spins = (len(done) - started) / (time.time() - t0)
    stop.set()
    for t in threads:
        t.join()
    proc.terminate()
    proc.wait(timeout=30)
    lat.sort()
    return {"n": len(lat), "p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99) - 1],
            "max": lat[-1], "spins_per_s": spins}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--testkit", required=True)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as repo:
        build_repo(repo, a.testkit)
        heavy = max(1, a.cores - 1)
        limited = ["--rate-limit", "execution_count", "--rate-limit-resource", f"HEAVY:{heavy}"]
        rows = [
            ("idle", phase(a.wisp, repo, [], 0, a.seconds)),
            ("16 spinning, no limiter", phase(a.wisp, repo, [], 16, a.seconds)),
            (f"16 spinning, --rate-limit (HEAVY:{heavy})", phase(a.wisp, repo, limited, 16, a.seconds)),
        ]
    print(f"add_sub latency (ms) over {a.seconds:.0f} s of sequential requests, {a.cores} cores")
    print(f"{'phase':42} {'n':>6} {'p50':>8} {'p99':>8} {'max':>8} {'spins/s':>8}")
    for name, r in rows:
        print(f"{name:42} {r['n']:6d} {r['p50']:8.2f} {r['p99']:8.2f} {r['max']:8.2f} {r['spins_per_s']:8.1f}")


if __name__ == "__main__":
    main()
