"""Three `wisp` replicas behind nginx, run with `deploy/nginx/wisp.conf` as it is (ports and
paths substituted), under bounded load from NVIDIA's clients while one replica is killed and
restarted, one is rolled to a new model version, and one is stopped gracefully and restarted.
Used by test_loadbalancer.py (short) and benches/loadbalancer.py (long)."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, env_args, free_port, wisp_command

TEMPLATE = os.path.join(ROOT, "deploy", "nginx", "wisp.conf")
MODEL = "add_sub"
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "repo", MODEL)


def nginx_binary():
    for path in ("/usr/sbin/nginx", shutil.which("nginx")):
        if path and os.path.exists(path):
            return path
    return None


class Replica:
    """One `wisp serve` on fixed ports (the load balancer knows them) with its own repository."""

    def __init__(self, index, workdir, engine):
        self.index = index
        self.engine = engine
        self.repo = os.path.join(workdir, f"repo{index}")
        shutil.copytree(FIXTURE, os.path.join(self.repo, MODEL))
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log_path = os.path.join(workdir, f"replica{index}.log")
        self.proc = None

    def start(self, ready_within=60):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [*wisp_command(), "serve", "--model-repository", self.repo,
             "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
             "--grpc-port", str(self.grpc_port), "--metrics-port", str(free_port()),
             "--model-control-mode", "explicit", "--allow-unauthenticated-control",
             "--load-model", MODEL,
             "--onnx-engine", self.engine, "--exit-timeout-secs", "10", *env_args()],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.time() + ready_within
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"replica {self.index} did not become ready; see {self.log_path}")

    def kill(self):
        """SIGKILL: requests in flight on it are cut."""
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        """SIGTERM: stops accepting, finishes what it has, exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        assert code == 0, f"replica {self.index} exited with {code} on SIGTERM"

    def roll(self):
        """Adds version 2 of the model and loads it: Wisp loads it beside version 1, then swaps."""
        shutil.copytree(os.path.join(self.repo, MODEL, "1"), os.path.join(self.repo, MODEL, "2"))
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v2/repository/models/{MODEL}/load",
            data=b"{}", method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200


def nginx_config(workdir, http_port, grpc_port, replicas):
    """deploy/nginx/wisp.conf with this run's ports and a private pid and temp paths."""
    ports = {"8000": http_port, "8010": grpc_port}
    for r in replicas:
        ports[f"800{r.index}"] = r.http_port
        ports[f"801{r.index}"] = r.grpc_port
    with open(TEMPLATE) as f:
        text = f.read()
    text = re.sub(r"127\.0\.0\.1:(80\d\d)\b", lambda m: f"127.0.0.1:{ports[m.group(1)]}", text)
    text = text.replace("/tmp/wisp-nginx", os.path.join(workdir, "nginx"))
    path = os.path.join(workdir, "nginx.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


class Load:
    """`threads` clients in a loop until stopped, one of them over gRPC, every answer checked."""

    def __init__(self, http_url, grpc_url, threads):
        self.http_url, self.grpc_url = http_url, grpc_url
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.done = []           # (time, ok, version)
        self.errors = []
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(threads)]

    def client(self, i):
        grpc = i == 0
        proto = grpcclient if grpc else httpclient
        c = (grpcclient.InferenceServerClient(url=self.grpc_url) if grpc
             else httpclient.InferenceServerClient(url=self.http_url))
        k = 0
        while not self.stopping.is_set():
            k += 1
            a = np.full((1, 16), i * 1000 + k % 1000, np.float32)
            b = np.ones((1, 16), np.float32)
            ins = [proto.InferInput("INPUT0", [1, 16], "FP32"), proto.InferInput("INPUT1", [1, 16], "FP32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            ok, version = False, None
            try:
                r = c.infer(MODEL, ins)
                ok = np.array_equal(r.as_numpy("OUTPUT0"), a + b)
                version = (r.get_response().model_version if grpc
                           else r.get_response()["model_version"])
                if not ok:
                    raise AssertionError("wrong answer")
            except Exception as e:  # every failure is counted, whatever its kind
                with self.lock:
                    self.errors.append(f"{'grpc' if grpc else 'http'}: {e}")
            with self.lock:
                self.done.append((time.time(), ok, version))

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)


def run(seconds, threads, engine="tract"):
    """The scenario; returns a dict of what happened (see `report`)."""
    nginx = nginx_binary()
    assert nginx, "nginx is not installed (./dev test installs it)"
    workdir = tempfile.mkdtemp(prefix="wisp-lb-")
    replicas = [Replica(i, workdir, engine) for i in (1, 2, 3)]
    http_port, grpc_port = free_port(), free_port()
    conf = nginx_config(workdir, http_port, grpc_port, replicas)
    lb = None
    events = []
    load = Load(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", threads)
    try:
        for r in replicas:
            r.start()
        lb = subprocess.Popen([nginx, "-c", conf, "-g", "daemon off;"],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "nginx.log"), "w"))
        deadline = time.time() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1):
                    break
            except OSError:
                assert time.time() < deadline and lb.poll() is None, "nginx did not start"
                time.sleep(0.05)
        start = time.time()
        load.start()
        plan = [(0.2, "kill replica 1", replicas[0].kill),
                (0.3, "restart replica 1", replicas[0].start),
                (0.45, "roll replica 2 to version 2", replicas[1].roll),
                (0.6, "SIGTERM replica 3", replicas[2].stop),
                (0.7, "restart replica 3", replicas[2].start)]
        for at, what, action in plan:
            time.sleep(max(0.0, start + at * seconds - time.time()))
            t0 = time.time()
            action()
            events.append((t0 - start, time.time() - start, what))
        time.sleep(max(0.0, start + seconds - time.time()))
        load.stop()
    finally:
        load.stopping.set()
        if lb is not None:
            lb.terminate()
            lb.wait(timeout=10)
        for r in replicas:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
    done = sorted(load.done)
    buckets = {}
    for t, ok, _ in done:
        if ok:
            sec = int(t - start)
            buckets[sec] = buckets.get(sec, 0) + 1
    per_sec = [buckets.get(s, 0) for s in range(int(seconds))]
    first_event = int(events[0][0]) if events else len(per_sec)
    baseline = sorted(per_sec[:first_event])[len(per_sec[:first_event]) // 2] if first_event else 0
    during = per_sec[first_event:int(events[-1][1]) + 2] if events else []
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "seconds": seconds, "threads": threads, "requests": len(done),
        "failed": sum(1 for _, ok, _ in done if not ok), "errors": load.errors[:5],
        "failed_grpc": sum(1 for e in load.errors if e.startswith("grpc:")),
        "failed_http": sum(1 for e in load.errors if e.startswith("http:")),
        "versions": sorted({str(v) for _, ok, v in done if ok}),
        "per_second": per_sec, "baseline": baseline,
        "lowest_during_events": min(during) if during else None, "events": events,
    }


def report(result):
    """A few lines of markdown for a result of `run`."""
    lines = [
        f"- {result['requests']} requests in {result['seconds']} s from {result['threads']} clients "
        f"(one over gRPC): **{result['failed']} failed** ({result['failed_http']} HTTP, "
        f"{result['failed_grpc']} gRPC)",
        f"- throughput: baseline {result['baseline']} req/s (median second before the first "
        f"event), lowest second during the events {result['lowest_during_events']} req/s",
        f"- versions answered: {', '.join(result['versions'])}",
        "- per second: " + " ".join(str(n) for n in result["per_second"]),
    ]
    for t0, t1, what in result["events"]:
        lines.append(f"- {t0:5.1f} s → {t1:5.1f} s: {what}")
    for e in result["errors"]:
        lines.append(f"- error: {e}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(10, 4), indent=1))
