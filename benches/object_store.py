"""Object-store cold start: the demo repository served from a local directory and from each
object store (an empty mirror: list, download, load), side by side in one run: S3 (moto's
server), GCS (fake-gcs-server) and Azure (Azurite), all on loopback.

    python benches/object_store.py [--wisp BIN] [--repo model_repo] [--runs 3] [--stores s3,gs,as]

Reports, per run, the time from starting `wisp serve` to `/v2/health/ready` for each, and the
bytes the bucket held. Loopback stores measure Wisp's listing, download and mirroring cost (and
the emulator's), not a real network's. Needs what ./dev test installs (the Python packages and
Azurite in tests/emulators).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))
from conftest import free_port  # noqa: E402


def time_to_ready(cmd, env, within=600):
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--http-address", "127.0.0.1", "--http-port", str(port),
                             "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < within:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                    return time.perf_counter() - t0
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"wisp exited with {proc.returncode}")
                time.sleep(0.02)
        raise RuntimeError("not ready in time")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", default=os.path.join(ROOT, "target", "release", "wisp"))
    ap.add_argument("--repo", default=os.path.join(ROOT, "model_repo"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stores", default="s3,gs,as")
    args = ap.parse_args()
    from test_object_store import GCS, S3, Azure
    work = tempfile.mkdtemp(prefix="wisp-bench-store-")
    stores = []
    for scheme in args.stores.split(","):
        stores.append({"s3": S3, "gs": lambda: GCS(work), "as": lambda: Azure(work)}[scheme]())
    total = 0
    for root, _, files in os.walk(args.repo):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                data = fh.read()
            for store in stores:
                store.put("demo/" + os.path.relpath(path, args.repo), data)
            total += len(data)
    wasm_cache = os.path.join(work, "wasm")
    common = [args.wisp, "serve", "--wasm-cache-dir", wasm_cache]
    # Warm the plugin cache once, so every row measures loading, not compiling.
    time_to_ready([*common, "--model-repository", args.repo], dict(os.environ))
    local, remote = [], {s.scheme: [] for s in stores}
    try:
        for _ in range(args.runs):
            local.append(time_to_ready([*common, "--model-repository", args.repo],
                                       dict(os.environ)))
            for store in stores:
                mirror = os.path.join(work, "mirror")
                shutil.rmtree(mirror, ignore_errors=True)
                remote[store.scheme].append(time_to_ready(
                    [*common, "--model-repository", store.url("demo"),
                     "--repository-cache-dir", mirror], {**os.environ, **store.env()}))
    finally:
        for store in stores:
            store.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"binary": args.wisp, "bytes": total, "local_s": local, "cold_s": remote}))
    print(f"\nrepository {args.repo}: {total / 1e6:.1f} MB in each store; {args.runs} runs, "
          "plugin cache warm\n")
    print("| source | median s to ready | runs |")
    print("|---|---|---|")
    print(f"| local directory | {statistics.median(local):.2f} | {' '.join(f'{x:.2f}' for x in local)} |")
    for scheme, runs in remote.items():
        print(f"| {scheme}:// (empty mirror: list, download, load) | {statistics.median(runs):.2f} | "
              f"{' '.join(f'{x:.2f}' for x in runs)} |")


if __name__ == "__main__":
    main()
