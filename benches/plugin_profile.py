"""Where a plugin call's time goes: perf's call-graph samples of `wisp serve` while one client
sends add/sub requests to one plugin model at concurrency 1, attributed under the plugin
instance's `execute` by what each sample is doing (guest code, lowering the arguments into the
guest, the guest allocations the host asks for, lifting the results, post-return, Wisp's own
checks).

    python benches/plugin_profile.py --wisp target/profiling/release/wisp [--model add_sub_rust] [--seconds 8]

`./dev bench plugin-profile` builds `target/profiling/release/wisp` (release, frame pointers kept, so
perf can walk the host's stacks; wasmtime keeps them in guest code) and runs this. perf's own
overhead inflates every figure (compute_infer about 2.5x); the shares are what it is for. The
statistics extension's figures without perf come first.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plugin_path as pp  # noqa: E402

EXECUTE = "WasmInstance as wisp_core::backend::Instance>::execute"
# Categories, first match wins, on the frames between a sample's leaf and `execute`.
CATEGORIES = [
    ("guest allocations asked by the host (realloc)", ("realloc",)),
    ("lowering arguments into the guest", ("lower",)),
    ("lifting results out of the guest", ("lift", "WasmList")),
    ("post-return (guest frees)", ("post_return",)),
    ("guest code and wasm entry", ("wasm[0]", "#execute", "catch_traps", "invoke_wasm")),
    ("wasmtime's call machinery (typed call, ABI info, resource tables)", ("wasmtime::",)),
    ("Wisp: results checked into tensors", ("check_response", "from_wit", "spec_from_iter",
                                            "IntoIter")),
    ("Wisp: request parts, deadline, timing", ("WitParts", "arm", "Instant", "clock_gettime",
                                                "PluginOutput", "set_epoch_deadline")),
]


def serve(wisp, repo, model):
    return pp.serve(wisp, repo, extra=("--model-control-mode", "explicit", "--load-model", model),
                    env=dict(os.environ, WISP_WASM_PERFMAP="1"))


def rounds(port, model, seconds):
    out, began = [], time.time()
    while time.time() - began < seconds:
        out.append(pp.load(port, model, 2000, 1))
    return {k: statistics.median(r[k] for r in out) for k in ("queue", "compute_infer", "server")}


def attribute(script):
    def name(line):
        parts = line.strip().split(None, 1)
        return parts[1] if len(parts) > 1 else parts[0]
    total = inside = 0
    cats = collections.Counter()
    for stack in re.split(r"\n\s*\n", script):
        frames = [name(l) for l in stack.strip().split("\n") if l.strip()]
        if not frames:
            continue
        total += 1
        at = next((i for i, f in enumerate(frames) if EXECUTE in f), None)
        if at is None:
            continue
        inside += 1
        chain = " | ".join(frames[:at])
        for label, keys in CATEGORIES:
            if any(k in chain for k in keys):
                cats[label] += 1
                break
        else:
            cats["other (host allocation, iterators, execute itself)"] += 1
    return total, inside, cats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--model", default="add_sub_rust")
    ap.add_argument("--seconds", type=float, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        repo = os.path.join(d, "repo")
        os.makedirs(repo)
        pp.build_repo(repo)
        proc, port = serve(args.wisp, repo, args.model)
        try:
            pp.load(port, args.model, 2000, 1)  # warm
            plain = rounds(port, args.model, args.seconds)
            data = os.path.join(d, "perf.data")
            perf = subprocess.Popen(["perf", "record", "-F", "15000", "-g", "-o", data, "-p",
                                     str(proc.pid)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(1)
            profiled = rounds(port, args.model, args.seconds)
            perf.send_signal(2)
            perf.wait()
            script = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"],
                                    capture_output=True, text=True).stdout
        finally:
            proc.terminate()
            proc.wait()
    total, inside, cats = attribute(script)
    print(f"model {args.model}, c=1, from the statistics extension (µs per request):")
    print("| run | queue | compute_infer | server-side |\n|---|---|---|---|")
    for label, r in (("without perf", plain), ("under perf", profiled)):
        print(f"| {label} | {r['queue']:.1f} | {r['compute_infer']:.1f} | {r['server']:.1f} |")
    print(f"\n{inside} of {total} samples ({inside / max(1, total):.1%}) under the instance's execute:")
    print("| share of execute | what |\n|---|---|")
    for label, n in cats.most_common():
        print(f"| {n / max(1, inside):.1%} | {label} |")


if __name__ == "__main__":
    main()
