"""Object-store cold start: the demo repository served from a local directory and from an S3
bucket (moto's S3 server on loopback, an empty mirror: download plus load), side by side.

    python benches/object_store.py [--wisp BIN] [--repo model_repo] [--runs 3]

Reports, per run, the time from starting `wisp serve` to `/v2/health/ready` for each, and the
bytes the bucket held. Loopback S3 measures Wisp's listing, download and mirroring cost, not a
real network's. Needs `moto[server]` and `boto3` (installed by ./dev test's Python setup).
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

import boto3

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
    args = ap.parse_args()
    from moto.server import ThreadedMotoServer
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench",
                      aws_secret_access_key="bench", region_name="us-east-1")
    s3.create_bucket(Bucket="models")
    total = 0
    for root, _, files in os.walk(args.repo):
        for f in files:
            path = os.path.join(root, f)
            s3.upload_file(path, "models", "demo/" + os.path.relpath(path, args.repo))
            total += os.path.getsize(path)
    work = tempfile.mkdtemp(prefix="wisp-bench-s3-")
    wasm_cache = os.path.join(work, "wasm")
    base = {**os.environ, **creds, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    common = [args.wisp, "serve", "--wasm-cache-dir", wasm_cache]
    # Warm the plugin cache once, so both sides measure loading, not compiling.
    time_to_ready([*common, "--model-repository", args.repo], base)
    local, remote = [], []
    try:
        for _ in range(args.runs):
            local.append(time_to_ready([*common, "--model-repository", args.repo], base))
            mirror = os.path.join(work, "mirror")
            shutil.rmtree(mirror, ignore_errors=True)
            remote.append(time_to_ready([*common, "--model-repository", "s3://models/demo",
                                         "--repository-cache-dir", mirror], base))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"binary": args.wisp, "bytes": total, "local_s": local, "s3_cold_s": remote}))
    print(f"\nrepository {args.repo}: {total / 1e6:.1f} MB in the bucket; {args.runs} runs, plugin cache warm\n")
    print("| source | median s to ready | runs |")
    print("|---|---|---|")
    print(f"| local directory | {statistics.median(local):.2f} | {' '.join(f'{x:.2f}' for x in local)} |")
    print(f"| s3:// (empty mirror: list, download, load) | {statistics.median(remote):.2f} | "
          f"{' '.join(f'{x:.2f}' for x in remote)} |")


if __name__ == "__main__":
    main()
