"""Tiny ONNX models: what one `add_sub` request (two 16-float inputs) costs on ONNX Runtime
against tract, and where ONNX Runtime's time goes (issue 52, item 5).

Two `wisp serve` processes of the same repository (the fixture `add_sub`), one per engine
(`--onnx-engine onnxruntime` / `tract`), loaded alternately from one HTTP client at
concurrency 1 over keep-alive JSON. For each it reports, per request and as medians over the
rounds, queue and compute_infer from the statistics extension, and the client's p50. Then,
with `--perf`, 8 s of `perf record` on each server under the same load, its samples split by
where they fall (ONNX Runtime's library, wisp with tract linked in, libc, the kernel), as
shares of its samples.

    python benches/tiny_onnx.py --wisp target/release/wisp [--rounds 5] [--requests 2000] [--perf]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plugin_path as pp  # noqa: E402

ROOT = pp.ROOT


def perf_split(pid, port, seconds):
    """perf samples of `pid` while the client loads it: {where: share}, and requests sent."""
    scratch = tempfile.mkdtemp(prefix="wisp-tiny-onnx-perf-")
    data = os.path.join(scratch, "perf.data")
    perf = subprocess.Popen(["perf", "record", "-F", "4999", "-p", str(pid), "-o", data, "--",
                             "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sent = 0
    t = time.time()
    while time.time() - t < seconds:
        pp.load(port, "add_sub", 200, 1)
        sent += 200
    perf.wait()
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso",
                          "--stdio"], capture_output=True, text=True).stdout
    shutil.rmtree(scratch, ignore_errors=True)
    shares = {}
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pct, _, dso = line.partition("%")
        dso = dso.strip()
        where = ("ONNX Runtime" if "onnxruntime" in dso else
                 "kernel" if "kernel" in dso else
                 "libc" if "libc" in dso or "ld-linux" in dso else
                 "wisp (incl. tract)" if "wisp" in dso else dso or "other")
        shares[where] = shares.get(where, 0.0) + float(pct)
    return shares, sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--perf", action="store_true", help="also split each server's CPU by library")
    args = ap.parse_args()
    if not os.environ.get("ORT_DYLIB_PATH"):
        sys.exit("ORT_DYLIB_PATH must name ONNX Runtime's library (./dev sets it)")
    repo = tempfile.mkdtemp(prefix="wisp-tiny-onnx-")
    servers = {}
    try:
        shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"),
                        os.path.join(repo, "add_sub"))
        for engine in ("onnxruntime", "tract"):
            servers[engine] = pp.serve(args.wisp, repo, engine)
        for engine, (_, port) in servers.items():
            pp.load(port, "add_sub", 500, 1)  # warm-up
        runs = {e: [] for e in servers}
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(list(servers)))
            for engine in order:
                runs[engine].append(pp.load(servers[engine][1], "add_sub", args.requests, 1))
        print(f"`{args.wisp}`, add_sub at c=1, {args.requests} requests per engine per round, "
              f"{args.rounds} rounds alternating, medians (µs per request)\n")
        print("| engine | queue | compute_infer | server-side | e2e p50 |")
        print("|---|---|---|---|---|")
        for engine, rs in runs.items():
            med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
            print(f"| {engine} | {med['queue']:.1f} | {med['compute_infer']:.1f} | "
                  f"{med['server']:.1f} | {med['p50']:.0f} |")
        if args.perf:
            print("\nWhere each server's CPU goes under that load (perf, share of its samples):\n")
            for engine, (proc, port) in servers.items():
                shares, sent = perf_split(proc.pid, port, 8)
                top = sorted(shares.items(), key=lambda kv: -kv[1])
                print(f"- {engine} ({sent} requests): " +
                      ", ".join(f"{k} {v:.1f}%" for k, v in top if v >= 0.5))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    main()
