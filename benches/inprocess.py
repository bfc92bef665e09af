"""In-process Python (`import wisp`) against NVIDIA's `tritonclient` over HTTP to the `wisp`
binary, on the same models of the same repository, measured side by side in one run.

    python benches/inprocess.py --wisp target/release/wisp --lib target/release/lib_wisp.so

Run through `./dev bench inprocess`, which builds both in release first. For each model it
alternates rounds of in-process and HTTP calls (so machine noise hits both alike) and reports
the median and p99 latency of one sequential request, then the throughput of 4 threads. The
HTTP client sends tensors as binary data, its fastest form.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import tritonclient.http as httpclient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))
from conftest import start_wisp, stop_wisp  # noqa: E402

MODELS = {
    "add_sub": lambda rng: {"INPUT0": rng.standard_normal((1, 16), dtype=np.float32),
                            "INPUT1": rng.standard_normal((1, 16), dtype=np.float32)},
    "ppocr_cls": lambda rng: {"x": rng.standard_normal((1, 3, 48, 192), dtype=np.float32)},
}
ROUNDS = 5
THREADS = 4


def import_wisp(lib):
    pkg = tempfile.mkdtemp(prefix="wisp-bench-py-")
    shutil.copytree(os.path.join(ROOT, "host", "python", "python", "wisp"),
                    os.path.join(pkg, "wisp"))
    shutil.copy(lib, os.path.join(pkg, "wisp", "_wisp.abi3.so"))
    sys.path.insert(0, pkg)
    import wisp
    return wisp


def http_call(client, model, inputs):
    wire = []
    for name, value in inputs.items():
        t = httpclient.InferInput(name, list(value.shape), "FP32")
        t.set_data_from_numpy(value, binary_data=True)
        wire.append(t)
    return client.infer(model, wire)


def timed(call, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def throughput(make_call, n_per_thread):
    calls = [make_call() for _ in range(THREADS)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=lambda c=c: [c() for _ in range(n_per_thread)])
               for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return THREADS * n_per_thread / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--repo", default=os.path.join(ROOT, "model_repo"))
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--requests", type=int, default=2000, help="per model and side (add_sub)")
    args = ap.parse_args()
    os.environ["WISP_BIN"] = args.wisp
    wisp = import_wisp(args.lib)
    load = [a for m in MODELS for a in ("--load-model", m)]
    proc, log, urls = start_wisp(args.repo, args.engine, "bench-inprocess.log",
                                 ["--model-control-mode", "explicit", *load])
    inproc = wisp.Server(args.repo, model_control_mode="explicit", load_model=list(MODELS),
                         onnx_engine=args.engine)
    rng = np.random.default_rng(0)
    rows = []
    try:
        for model, make in MODELS.items():
            inputs = make(rng)
            n = args.requests if model == "add_sub" else max(args.requests // 10, 50)
            client = httpclient.InferenceServerClient(url=urls["url"])
            a = inproc.infer(model, inputs)
            b = http_call(client, model, inputs)
            for name, value in a.items():
                np.testing.assert_allclose(value, b.as_numpy(name), rtol=1e-5, atol=1e-6)
            mine, theirs = [], []
            timed(lambda: inproc.infer(model, inputs), 20)
            timed(lambda: http_call(client, model, inputs), 20)
            for _ in range(ROUNDS):
                mine += timed(lambda: inproc.infer(model, inputs), n // ROUNDS)
                theirs += timed(lambda: http_call(client, model, inputs), n // ROUNDS)
            per_thread = max(n // (2 * THREADS), 10)
            tp_mine = throughput(lambda: (lambda: inproc.infer(model, inputs)), per_thread)

            def http_caller():
                c = httpclient.InferenceServerClient(url=urls["url"])
                return lambda: http_call(c, model, inputs)

            tp_theirs = throughput(http_caller, per_thread)
            q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1e6
            rows.append((model, len(mine), statistics.median(mine) * 1e6, q(mine, 0.99),
                         statistics.median(theirs) * 1e6, q(theirs, 0.99), tp_mine, tp_theirs))
    finally:
        inproc.shutdown()
        stop_wisp(proc, log)
    print(f"engine {args.engine}; {ROUNDS} alternating rounds; throughput with {THREADS} threads\n")
    print("| model | requests/side | in-process p50 µs | p99 | HTTP p50 µs | p99 | HTTP ÷ in-process (p50) "
          "| in-process req/s | HTTP req/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, n, p50, p99, h50, h99, t1, t2 in rows:
        print(f"| {m} | {n} | {p50:.0f} | {p99:.0f} | {h50:.0f} | {h99:.0f} | {h50 / p50:.1f}× "
              f"| {t1:.0f} | {t2:.0f} | {t1 / t2:.1f}× |")


if __name__ == "__main__":
    main()
