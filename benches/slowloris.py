"""Slow clients against the connection cap: health checks and good clients while five times
the cap of slow connections (bodies held half sent, heads trickled a line every 0.5 s) try to
fill it, reconnecting whenever they are cut, from another loopback address (127.0.0.2).

Three phases in one run, each on a fresh `wisp serve --max-connections CAP` over the test
fixtures (tract): no attack; the attack with the slow-client defences off (`--min-data-rate 0`,
which leaves only idle eviction, as before); the attack with the defaults. Reports, per phase,
the share of health checks answered (a new connection each, every 50 ms, 2 s to answer), their
p50 / p99 latency, and the good clients' throughput (4 keep-alive clients on add_sub).

    python benches/slowloris.py --wisp target/release/wisp [--cap 40] [--factor 5] [--seconds 20]
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTACKER = "127.0.0.2"
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
]}).encode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def read_response(reader):
    """Status and body of one HTTP/1.1 response (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    body = await reader.readexactly(length)
    return status, body


async def health_prober(port, until, out):
    while time.monotonic() < until:
        start = time.monotonic()
        try:
            async def check():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                status, _ = await read_response(reader)
                writer.close()
                return status
            status = await asyncio.wait_for(check(), 2.0)
            out.append(time.monotonic() - start if status == 200 else None)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            out.append(None)
        await asyncio.sleep(max(0.0, 0.05 - (time.monotonic() - start)))


async def good_client(port, until, counts):
    request = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
    writer = None
    while time.monotonic() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
            writer.write(request)
            status, _ = await asyncio.wait_for(read_response(reader), 2.0)
            counts["ok" if status == 200 else "failed"] += 1
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            counts["failed"] += 1
            writer = None
            await asyncio.sleep(0.01)


async def slow_client(port, until, kind, stats):
    """One slow connection, reopened whenever the server cuts it."""
    while time.monotonic() < until:
        try:
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((ATTACKER, 0))
            reader, writer = await asyncio.wait_for(_connect(sock, port), 2.0)
            stats["connections"] += 1
            if kind == "body":
                writer.write(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 100000\r\n\r\n{\"inputs\":")
                await writer.drain()
                # Held: nothing more until the server closes it.
                await reader.read()
            else:
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
                i = 0
                while time.monotonic() < until:
                    await asyncio.sleep(0.5)
                    writer.write(f"x-slow-{i}: 1\r\n".encode())
                    await writer.drain()
                    i += 1
                    if reader.at_eof():
                        break
            writer.close()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            await asyncio.sleep(0.05)


async def _connect(sock, port):
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


def start_wisp(binary, cap, extra):
    http, grpc, metrics = free_port(), free_port(), free_port()
    args = [binary, "serve", "--model-repository", os.path.join(ROOT, "tests/fixtures/repo"),
            "--http-address", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
            "--metrics-port", str(metrics), "--onnx-engine", "tract", "--log-info", "false",
            "--max-connections", str(cap)] + extra
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", http), timeout=1) as s:
                s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, http
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit("wisp did not become ready")


async def attack(port, n, seconds):
    """`n` slow clients for `seconds` (run in a process of its own, so that the measuring
    clients' event loop is not the attackers')."""
    until = time.monotonic() + seconds
    stats = {"connections": 0}
    tasks = [asyncio.create_task(slow_client(port, until, "body" if i % 2 == 0 else "head", stats))
             for i in range(n)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats["connections"]


def attack_process(port, n, seconds, out):
    out.put(asyncio.run(attack(port, n, seconds)))


async def phase(port, cap, factor, seconds, attacked):
    until = time.monotonic() + seconds
    health, counts = [], {"ok": 0, "failed": 0}
    tasks = []
    attacker = None
    if attacked:
        out = multiprocessing.Queue()
        attacker = multiprocessing.Process(target=attack_process, args=(port, cap * factor, seconds + 3, out))
        attacker.start()
        await asyncio.sleep(2.0)  # let them settle in and fill the cap
        until = time.monotonic() + seconds
    tasks.append(asyncio.create_task(health_prober(port, until, health)))
    tasks += [asyncio.create_task(good_client(port, until, counts)) for _ in range(4)]
    await asyncio.sleep(seconds + 0.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    opened = 0
    if attacker is not None:
        opened = out.get(timeout=30)
        attacker.join(10)
    answered = [h for h in health if h is not None]
    q = lambda p: (statistics.quantiles(answered, n=100)[p - 1] * 1000 if len(answered) >= 2 else float("nan"))
    return {
        "health_checks": len(health),
        "answered_pct": 100.0 * len(answered) / max(1, len(health)),
        "p50_ms": q(50),
        "p99_ms": q(99),
        "good_rps": counts["ok"] / seconds,
        "good_failed": counts["failed"],
        "slow_connections": opened,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", default=os.path.join(ROOT, "target/release/wisp"))
    ap.add_argument("--cap", type=int, default=40)
    ap.add_argument("--factor", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    phases = [
        ("no attack", [], False),
        ("attack, defences off (--min-data-rate 0)", ["--min-data-rate", "0"], True),
        ("attack, defaults", [], True),
    ]
    rows = []
    for label, extra, attack in phases:
        proc, port = start_wisp(a.wisp, a.cap, extra)
        try:
            rows.append((label, asyncio.run(phase(port, a.cap, a.factor, a.seconds, attack))))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"binary: {a.wisp}; --max-connections {a.cap}; {a.cap * a.factor} slow connections "
          f"(half bodies held, half heads trickled) from {ATTACKER}; {a.seconds:.0f} s a phase\n")
    print("| phase | health checks | answered | p50 ms | p99 ms | good req/s | good failed | slow connections opened |")
    print("|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['health_checks']} | {r['answered_pct']:.1f}% | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['good_rps']:.0f} | {r['good_failed']} | {r['slow_connections']} |")


if __name__ == "__main__":
    main()
