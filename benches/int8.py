"""INT8 against FP32 on this host, judged by Wisp's own gate (issue 53, items 4 and 6).

For the demo's embeddings encoder (all_minilm_l6_v2) and PP-OCR direction classifier
(ppocr_cls), version 2 is made from version 1 by ONNX Runtime's quantizer (the encoder:
dynamic INT8, per-channel weights; the classifier: static QDQ, unsigned activations,
per-tensor weights, calibrated on 32 generated crops), in a scratch copy of the repository
that serves both versions (`version_policy: all`) with a gate: `gate.baseline_version: 1`,
`gate.min_cosine: 0.99` for the encoder, `gate.min_top1: 0.9` for the classifier, held-out
samples in `model_warmup`. One `wisp serve` per engine starts on it; its repository index
and model metadata say whether version 2 passed its gate and what it measured. Then, per
model and version, one client thread (c=1) and eight (c=8) send the same request for
`--seconds` (versions alternating, same process): req/s, p50 and p99; and on `--held-out`
fresh inputs the agreement of version 2 with version 1 (min cosine per token row; top-1).

First, per engine, `wisp quantize` itself on each model from ten generated request bodies:
its table of every INT8 format judged by the gate, and what it wrote (or why nothing).

    python benches/int8.py --wisp target/release/wisp [--engines onnxruntime,tract] [--seconds 5]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "conformance"))
from conftest import ROOT, start_wisp, stop_wisp  # noqa: E402

SEQ = 32
RNG = np.random.default_rng(11)


def tokens(n, padded=True):
    """`n` token rows as text_tokenize would give them: [CLS] words [SEP], padded to SEQ (a
    lone request's sentence fills it: nothing to pad)."""
    ids = np.zeros((n, SEQ), np.int64)
    mask = np.zeros((n, SEQ), np.int64)
    for i in range(n):
        k = int(RNG.integers(6, SEQ - 2)) if padded else SEQ - 2
        ids[i, 0], ids[i, 1:k + 1], ids[i, k + 1] = 101, RNG.integers(1996, 12000, k), 102
        mask[i, :k + 2] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def crops(n):
    """`n` text-line-like crops in [-1, 1]: dark strokes on a light band, then noise."""
    x = np.full((n, 3, 48, 192), 0.8, np.float32)
    for i in range(n):
        for _ in range(int(RNG.integers(4, 12))):
            c = int(RNG.integers(4, 180))
            r = int(RNG.integers(10, 30))
            x[i, :, r:r + int(RNG.integers(6, 16)), c:c + int(RNG.integers(2, 10))] = -0.8
    x += RNG.normal(0, 0.1, x.shape).astype(np.float32)
    return np.clip(x, -1, 1)


def quantize(name, src, dst):
    from onnxruntime import quantization as q
    if name == "all_minilm_l6_v2":
        q.quantize_dynamic(src, dst, per_channel=True, weight_type=q.QuantType.QInt8)
        return "dynamic INT8, per-channel weights"

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.rows = iter([{"x": crops(1)} for _ in range(32)])

        def get_next(self):
            return next(self.rows, None)

    q.quantize_static(src, dst, Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                      per_channel=False)
    return "static QDQ, uint8 activations, per-tensor weights"


def write_held_out(model_dir, name):
    """model_warmup samples from files: what the gate judges version 2 on."""
    os.makedirs(os.path.join(model_dir, "warmup"), exist_ok=True)
    samples = []
    if name == "all_minilm_l6_v2":
        for s in range(3):
            t = tokens(1, padded=False)
            inputs = []
            for k, v in t.items():
                v[0].tofile(os.path.join(model_dir, "warmup", f"{k}{s}.bin"))
                inputs.append(f'inputs {{ key: "{k}" value {{ data_type: TYPE_INT64 dims: [ {SEQ} ] input_data_file: "{k}{s}.bin" }} }}')
            samples.append(f'{{ name: "held-out-{s}" batch_size: 1 {" ".join(inputs)} }}')
        gate = {"gate.min_cosine": "0.99"}  # every token row (the goal, per token)
    else:
        for s in range(3):
            crops(1)[0].tofile(os.path.join(model_dir, "warmup", f"x{s}.bin"))
            samples.append(f'{{ name: "held-out-{s}" batch_size: 1 inputs {{ key: "x" value {{ data_type: TYPE_FP32 dims: [ 3, 48, 192 ] input_data_file: "x{s}.bin" }} }} }}')
        gate = {"gate.min_top1": "0.9"}
    # INT8 must earn its place on speed too: no slower than FP32 on this host.
    gate.update({"gate.baseline_version": "1", "gate.max_latency_ratio": "1"})
    params = ", ".join(f'{{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in gate.items())
    return (f"parameters [ {params} ]\n"
            f"model_warmup [ {', '.join(samples)} ]\n")


def make_repos():
    """Two copies of the two models with an INT8 version 2: one gated (held-out samples and
    bounds), one plain, serving both versions for the figures."""
    gated = tempfile.mkdtemp(prefix="wisp-int8-gated-")
    plain = tempfile.mkdtemp(prefix="wisp-int8-plain-")
    formats = {}
    for name in ("all_minilm_l6_v2", "ppocr_cls"):
        src = os.path.join(ROOT, "model_repo", name)
        dst = os.path.join(plain, name)
        shutil.copytree(src, dst)
        os.makedirs(os.path.join(dst, "2"))
        formats[name] = quantize(name, os.path.join(dst, "1", "model.onnx"),
                                 os.path.join(dst, "2", "model.onnx"))
        shutil.copytree(dst, os.path.join(gated, name))
        with open(os.path.join(dst, "config.pbtxt"), "a") as f:
            f.write("version_policy: { all { } }\n")
        with open(os.path.join(gated, name, "config.pbtxt"), "a") as f:
            f.write(write_held_out(os.path.join(gated, name), name))
    return gated, plain, formats


def quantize_tables(wisp, engine, seconds_budget=900):
    """`wisp quantize` on each model from ten request bodies like the bench's: its table of
    every INT8 format on `engine`, judged by the gate (the model's float version against
    each), and what it wrote."""
    import subprocess
    out = []
    for name in ("all_minilm_l6_v2", "ppocr_cls"):
        scratch = tempfile.mkdtemp(prefix="wisp-int8-quantize-")
        try:
            model = os.path.join(scratch, "repo", name)
            shutil.copytree(os.path.join(ROOT, "model_repo", name), model)
            cal = os.path.join(scratch, "bodies")
            os.makedirs(cal)
            for i in range(10):
                inputs = tokens(1, padded=False) if name == "all_minilm_l6_v2" else {"x": crops(1)}
                with open(os.path.join(cal, f"{i:02}.json"), "wb") as f:
                    f.write(body(inputs))
            # (neither model declares a gate: wisp quantize's default, a cosine of 0.99 on
            # every output row and no slower than FP32)
            r = subprocess.run([wisp, "quantize", model, "--calibration", cal, "--onnx-engine", engine],
                               capture_output=True, text=True, timeout=seconds_budget)
            table = [line for line in r.stdout.splitlines() if line.startswith("|")]
            last = (r.stdout.strip().splitlines() or [""])[-1] if r.returncode == 0 else \
                (r.stderr.strip().splitlines() or [""])[-1]
            out.append((name, table, last.replace(scratch, "…")))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return out


def body(inputs):
    return json.dumps({"inputs": [
        {"name": k, "shape": list(v.shape), "datatype": "INT64" if v.dtype == np.int64 else "FP32",
         "data": v.flatten().tolist()} for k, v in inputs.items()]}).encode()


def post(url, path, data, timeout=60):
    req = urllib.request.Request(f"http://{url}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url, path):
    with urllib.request.urlopen(f"http://{url}{path}", timeout=30) as r:
        return json.loads(r.read())


def load(url, name, version, data, clients, seconds):
    """req/s, p50 ms, p99 ms of `clients` threads sending `data` for `seconds`."""
    import http.client
    host, port = url.split(":")
    lat, stop = [], time.time() + seconds
    lock = threading.Lock()

    def run():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        mine = []
        while time.time() < stop:
            t = time.perf_counter()
            conn.request("POST", f"/v2/models/{name}/versions/{version}/infer", data,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            assert r.status == 200, r.status
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    started = time.time()
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - started
    lat.sort()
    return len(lat) / took, lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3


def agreement(url, name, n):
    if name == "all_minilm_l6_v2":
        worst = 1.0
        for _ in range(n):
            t = tokens(1, padded=False)
            outs = []
            for v in (1, 2):
                r = post(url, f"/v2/models/{name}/versions/{v}/infer", body(t))
                outs.append(np.array(r["outputs"][0]["data"], np.float64).reshape(-1, 384))
            keep = t["attention_mask"][0].astype(bool)
            a, b = outs[0][keep], outs[1][keep]
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            worst = min(worst, float(cos.min()))
        return f"min token cosine {worst:.4f}"
    agree = 0
    for _ in range(n):
        x = {"x": crops(1)}
        tops = [int(np.argmax(post(url, f"/v2/models/{name}/versions/{v}/infer", body(x))["outputs"][0]["data"]))
                for v in (1, 2)]
        agree += tops[0] == tops[1]
    return f"top-1 agreement {agree / n:.3f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--wisp", required=True)
    p.add_argument("--engines", default="onnxruntime,tract")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--held-out", type=int, default=20)
    a = p.parse_args()
    os.environ["WISP_BIN"] = os.path.abspath(a.wisp)
    gated, plain, formats = make_repos()
    try:
        print(f"# INT8 against FP32, {time.strftime('%Y-%m-%d')}, `python benches/int8.py` "
              f"({os.cpu_count()} cores, {a.seconds:g} s per point)\n")
        for name, fmt in formats.items():
            sizes = [os.path.getsize(os.path.join(plain, name, v, "model.onnx")) / 1e6 for v in ("1", "2")]
            print(f"- {name}: version 2 is {fmt}; {sizes[0]:.1f} MB → {sizes[1]:.1f} MB")
        print()
        for engine in a.engines.split(","):
            print(f"## {engine}\n")
            print(f"### `wisp quantize --onnx-engine {engine}` on ten request bodies\n")
            for name, table, last in quantize_tables(os.path.abspath(a.wisp), engine):
                print(f"{name}:\n")
                print("\n".join(table))
                print(f"\n{last}\n")
            print("### The bench's INT8 versions, served\n")
            # The gate: version 1 serves, version 2 only if it keeps every bound.
            proc, log, urls = start_wisp(gated, engine, f"int8-gated-{engine}.log", ready_within=300)
            try:
                url = urls["url"]
                index = post(url, "/v2/repository/index", b"{}")
                for name in formats:
                    row = next((r for r in index if r["name"] == name and r.get("version") == "2"), None)
                    if row is None:
                        verdict = f"not served; {next(r for r in index if r['name'] == name).get('reason')}"
                    elif row.get("state") == "READY":
                        verdict = get(url, f"/v2/models/{name}/versions/2")["parameters"].get("gate", "not judged")
                    else:
                        verdict = f"{row.get('state')}: {row.get('reason', '')}"
                    print(f"- {name} version 2, the gate: {verdict}")
                print()
            finally:
                stop_wisp(proc, log)
            # The figures: both versions served, side by side in one process.
            proc, log, urls = start_wisp(plain, engine, f"int8-plain-{engine}.log", ready_within=300)
            try:
                url = urls["url"]
                index = post(url, "/v2/repository/index", b"{}")
                print("| model | version | c | req/s | p50 ms | p99 ms | INT8/FP32 req/s |")
                print("|---|---|---|---|---|---|---|")
                for name in formats:
                    ready = [r for r in index if r["name"] == name and r.get("state") == "READY"]
                    versions = [int(r["version"]) for r in ready]
                    data = body(tokens(1, padded=False) if name == "all_minilm_l6_v2" else {"x": crops(1)})
                    for c in (1, 8):
                        res = {}
                        for v in versions:
                            res[v] = load(url, name, v, data, c, a.seconds)
                        for v in versions:
                            ratio = f"{res[2][0] / res[1][0]:.2f}×" if v == 2 and 1 in res else ""
                            rps, p50, p99 = res[v]
                            print(f"| {name} | {v} ({'INT8' if v == 2 else 'FP32'}) | {c} | {rps:.1f} | {p50:.2f} | {p99:.2f} | {ratio} |")
                    missing = {1, 2} - set(versions)
                    if missing:
                        print(f"| {name} | {sorted(missing)} not ready: {[r.get('reason') for r in index if r['name'] == name and r.get('state') != 'READY']} | | | | | |")
                print()
                for name in formats:
                    if any(r["name"] == name and r.get("version") == "2" and r.get("state") == "READY" for r in index):
                        print(f"- {name}, version 2 against 1 on {a.held_out} fresh inputs: {agreement(url, name, a.held_out)}")
                print()
            finally:
                stop_wisp(proc, log)
    finally:
        shutil.rmtree(gated, ignore_errors=True)
        shutil.rmtree(plain, ignore_errors=True)


if __name__ == "__main__":
    main()
