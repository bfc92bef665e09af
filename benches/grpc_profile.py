"""Where the server's CPU goes per request over HTTP and over gRPC: a sampled profile of
`wisp-bench grpc` on one model, split by protocol and by what the time was spent in.

    python benches/grpc_profile.py [--bench PATH] [--engine E] [--model M] [--seconds S]
                                   [--concurrency C] [--runs N]

Each run is `perf record -e cpu-clock` (a sample every 100 µs of CPU time, kernel stacks
included; no hardware counters needed) around one round of `wisp-bench grpc --client-thread
--phases`, which loads the server over HTTP, then over gRPC, with the same lean clients and
prints when each load ran and how many requests it sent. A sample belongs to the load whose
interval holds it; samples of the process's main thread are the clients', all others the
server's. Each category's CPU time per request is its samples × 100 µs ÷ requests sent.

Kernel samples are grouped by the system call they sit under (the loopback send includes
delivering to the peer's socket and waking it), user samples by the crate of the function
they hit. On a VM without NMIs, kernel samples land on the points where interrupts are
re-enabled, so the grouping is by call, not by the exact kernel function.

Run through `./dev bench grpc-profile [FLAGS]`, which builds the release `wisp-bench` and
installs Debian's `linux-perf` if `perf` is missing. Needs root, or
`kernel.perf_event_paranoid` ≤ 1 for the kernel's share.
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERIOD_NS = 100_000

# (category, substrings of a kernel frame under which a sample counts for it), first match wins
KERNEL = [
    ("kernel: send (writev/sendmsg)", ["writev", "sendmsg", "sock_write_iter", "tcp_sendmsg"]),
    ("kernel: recv", ["recvfrom", "recvmsg", "tcp_recvmsg", "sock_read_iter"]),
    ("kernel: epoll_wait", ["epoll_wait"]),
    ("kernel: futex", ["futex"]),
    ("kernel: other", [""]),
]
# (category, substrings of a user-space symbol), first match wins
USER = [
    ("h2", ["h2::"]),
    ("hyper", ["hyper::", "hyper_util::"]),
    ("tonic, prost, pb", ["tonic", "prost", "::pb::"]),
    ("serde_json", ["serde"]),
    ("axum, tower", ["axum", "tower"]),
    ("http, httparse", ["http::", "httparse"]),
    ("tokio", ["tokio::"]),
    ("tract, ORT", ["tract", "onnxruntime", "Ort", "avx512_mmm", "fma_mmm"]),
    ("wisp", ["wisp"]),
    ("malloc, free", ["malloc", "free", "_int_", "realloc"]),
    ("memcpy, memcmp", ["memmove", "memcpy", "memcmp", "memset"]),
    ("other user space", [""]),
]


def category(frames):
    """The category of one sample, from its frames (leaf first) as (symbol, dso)."""
    kernel = [sym for sym, dso in frames if "kernel" in dso]
    if kernel:
        for name, pats in KERNEL:
            if any(p in sym for sym in kernel for p in pats):
                return name
    sym = frames[0][0] if frames else "?"
    for name, pats in USER:
        if any(p in sym for p in pats):
            return name
    raise AssertionError("unreachable: the last pattern matches everything")


def samples(dump):
    """(pid, tid, time, frames) per sample of a `perf script -F pid,tid,time,ip,sym,dso` dump."""
    head = re.compile(r"^\s*(\d+)/(\d+)\s+([\d.]+):\s*$")
    frame = re.compile(r"^\s+[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$")
    cur = None
    for line in dump.splitlines():
        m = head.match(line)
        if m:
            if cur:
                yield cur
            cur = (int(m.group(1)), int(m.group(2)), float(m.group(3)), [])
            continue
        m = frame.match(line)
        if m and cur:
            cur[3].append((m.group(1), m.group(2)))
    if cur:
        yield cur


def one_run(args, tmp, i):
    """One profiled round: {(protocol, side): {category: µs per request}} and the bench's rows."""
    data = os.path.join(tmp, f"run{i}.data")
    bench = [args.bench, "grpc", "--engine", args.engine, "--models", args.model,
             "--client-thread", "--phases", "--rounds", "1", "--seconds", str(args.seconds),
             "--batching-concurrency", str(args.concurrency)]
    rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-g",
                          "-k", "CLOCK_MONOTONIC", "-o", data, "--"] + bench,
                         capture_output=True, text=True)
    if rec.returncode != 0:
        sys.exit(f"grpc_profile: perf record failed:\n{rec.stderr}")
    phases = []
    for line in rec.stderr.splitlines():
        if line.startswith("phase "):
            _, proto, _model, _c, start, end, sent = line.split()
            phases.append((proto, float(start), float(end), int(sent)))
    if {p for p, *_ in phases} != {"http", "grpc"}:
        sys.exit(f"grpc_profile: no phases printed by wisp-bench:\n{rec.stderr}")
    dump = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,time,ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout
    counts = collections.defaultdict(collections.Counter)
    for pid, tid, t, frames in samples(dump):
        for proto, start, end, _sent in phases:
            if start <= t <= end:
                side = "client" if tid == pid else "server"
                counts[(proto, side)][category(frames)] += 1
                break
    sent = {p: n for p, _s, _e, n in phases}
    out = {}
    for (proto, side), c in counts.items():
        out[(proto, side)] = {k: v * PERIOD_NS / 1000 / sent[proto] for k, v in c.items()}
    rows = [line for line in rec.stdout.splitlines() if line.startswith(f"| {args.model} |")]
    return out, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, "target/release/wisp-bench"))
    ap.add_argument("--engine", default="tract")
    ap.add_argument("--model", default="add_sub")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="wisp-grpc-profile-") as tmp:
        for i in range(args.runs):
            out, rows = one_run(args, tmp, i)
            runs.append(out)
            for r in rows:
                print(f"run {i + 1}, wisp-bench's row: {r}")
    print(f"\n## Server CPU µs per request by category, `{args.model}` at concurrency "
          f"{args.concurrency}, engine {args.engine}: median of {args.runs} run(s) (each run's "
          f"figures in brackets)\n")
    print("| category | HTTP | gRPC | gRPC − HTTP |")
    print("|---|---|---|---|")
    names = [n for n, _ in KERNEL] + [n for n, _ in USER]

    def fig(proto, side, name):
        vals = [r.get((proto, side), {}).get(name, 0.0) for r in runs]
        return statistics.median(vals), vals

    def total(proto, side):
        vals = [sum(r.get((proto, side), {}).values()) for r in runs]
        return statistics.median(vals), vals

    def cell(m_vals):
        m, vals = m_vals
        return f"{m:.1f} ({', '.join(f'{v:.1f}' for v in vals)})"

    for name in names:
        h, g = fig("http", "server", name), fig("grpc", "server", name)
        if h[0] < 0.05 and g[0] < 0.05:
            continue
        print(f"| {name} | {cell(h)} | {cell(g)} | {g[0] - h[0]:+.1f} |")
    for side in ("server", "client"):
        h, g = total("http", side), total("grpc", side)
        print(f"| **{side} total** | {cell(h)} | {cell(g)} | {g[0] - h[0]:+.1f} |")


if __name__ == "__main__":
    main()
