"""The engine-correctness harness: ONNX's own backend test cases through Wisp, on each engine.

Each node case of the `onnx` package (`onnx.backend.test.case.node`, the cases its
`backend/test/data/node` files are generated from) becomes a model directory with a two-line
config (`platform: "onnxruntime_onnx"`, `max_batch_size: 0`; Wisp auto-completes the rest).
One `wisp serve --model-control-mode explicit` per engine loads each model through the
repository API, sends the case's inputs with tritonclient (binary tensors over HTTP), compares
every output with the case's expected one (dtype, shape, and values within the case's own
rtol / atol, NaN equal to NaN), and unloads it. Each case ends as:

- pass: every output matches;
- refused: the load failed, with its reason (the engine cannot run the model);
- error: the load worked but inference answered an error (not a silent wrong number either);
- wrong: inference answered, and an output differs from the expected one;
- skipped: the case is not a tensor model Wisp can be asked (sequence, map or optional
  inputs or outputs, bfloat16 which numpy lacks, or no inputs).

    python tests/engines/harness.py --wisp target/release/wisp [--engine tract|onnxruntime]...
        [--only NAME...] [--json OUT] [--markdown OUT] [--max-wrong N]

Exit status 1 when more than `--max-wrong` cases are wrong (default 0).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import warnings

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

SUPPORTED = {
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8,
    TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
    TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL,
    TensorProto.STRING,
}


def collect(only):
    from onnx.backend.test.case.node import collect_testcases
    # (generating the expected outputs divides by zero on purpose in places)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    cases = []
    for case in collect_testcases():
        if only and case.name not in only:
            continue
        cases.append(case)
    return sorted(cases, key=lambda c: c.name)


def why_skipped(case):
    g = case.model.graph
    init = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in init]
    if not inputs:
        return "no inputs"
    for v in list(inputs) + list(g.output):
        if not v.type.HasField("tensor_type"):
            return f"'{v.name}' is not a tensor"
        if v.type.tensor_type.elem_type not in SUPPORTED:
            return f"'{v.name}' has element type {TensorProto.DataType.Name(v.type.tensor_type.elem_type)}"
    if not case.data_sets:
        return "no data"
    ins, outs = case.data_sets[0]
    if len(ins) != len(inputs) or len(outs) != len(g.output):
        return "optional inputs or outputs left out"
    for v in list(ins) + list(outs):
        if not isinstance(v, np.ndarray):
            return "a value that is not an array"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, repo, engine):
    http, grpc, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [binary, "serve", "--model-repository", repo, "--model-control-mode", "explicit",
         "--allow-unauthenticated-control",
         "--onnx-engine", engine, "--http-address", "127.0.0.1", "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--log-info", "false",
         "--log-error", "false", "--log-warning", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/live", timeout=1):
                return proc, f"127.0.0.1:{http}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    sys.exit(f"wisp ({engine}) did not start")


def matches(got, want, rtol, atol):
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype == object or got.dtype == object:
        g = [x.decode() if isinstance(x, bytes) else x for x in got.ravel().tolist()]
        w = [x.decode() if isinstance(x, bytes) else x for x in want.ravel().tolist()]
        return None if g == w else "strings differ"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        bad = np.flatnonzero(got.ravel() != want.ravel())
    else:
        g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
        close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        bad = np.flatnonzero(~close)
    if bad.size:
        i = bad[0]
        return (f"{bad.size} of {want.size} values differ, first at {i}: "
                f"{got.ravel()[i]!r}, expected {want.ravel()[i]!r}")
    return None


def run_case(client, case):
    g = case.model.graph
    init = {t.name for t in g.initializer}
    names = [i.name for i in g.input if i.name not in init]
    ins, outs = case.data_sets[0]
    inputs = []
    for name, value in zip(names, ins):
        value = np.asarray(value)
        dt = "BYTES" if value.dtype == object else np_to_triton_dtype(value.dtype)
        t = httpclient.InferInput(name, list(value.shape), dt)
        t.set_data_from_numpy(value, binary_data=True)
        inputs.append(t)
    wanted = [httpclient.InferRequestedOutput(o.name, binary_data=True) for o in g.output]
    try:
        r = client.infer(case.name, inputs, outputs=wanted)
    except InferenceServerException as e:
        return "error", str(e)[:300]
    problems = []
    for o, want in zip(g.output, outs):
        got = r.as_numpy(o.name)
        if got is None:
            problems.append(f"'{o.name}' missing")
            continue
        why = matches(got, np.asarray(want), case.rtol, case.atol)
        if why:
            problems.append(f"'{o.name}': {why}")
    return ("wrong", "; ".join(problems)) if problems else ("pass", "")


def run_engine(binary, engine, cases, repo):
    proc, url = start(binary, repo, engine)
    client = httpclient.InferenceServerClient(url=url, network_timeout=120)
    results = {}
    try:
        for case in cases:
            try:
                client.load_model(case.name)
            except InferenceServerException as e:
                results[case.name] = ("refused", str(e)[:300])
                continue
            try:
                results[case.name] = run_case(client, case)
            except Exception as e:  # noqa: BLE001 - a client-side failure is an error too
                results[case.name] = ("error", f"{type(e).__name__}: {e}"[:300])
            try:
                client.unload_model(case.name)
            except InferenceServerException:
                pass
            if proc.poll() is not None:
                results[case.name] = ("error", "the server died")
                break
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--engine", action="append", choices=["tract", "onnxruntime"])
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--max-wrong", type=int, default=0)
    a = ap.parse_args()
    engines = a.engine or ["tract", "onnxruntime"]
    cases = collect(set(a.only))
    runnable, skipped = [], {}
    for c in cases:
        why = why_skipped(c)
        if why:
            skipped[c.name] = why
        else:
            runnable.append(c)
    report = {"onnx": onnx.__version__, "cases": len(cases), "skipped": skipped, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="wisp-engines-") as repo:
        for c in runnable:
            d = os.path.join(repo, c.name)
            os.makedirs(os.path.join(d, "1"))
            with open(os.path.join(d, "1", "model.onnx"), "wb") as f:
                f.write(c.model.SerializeToString())
            with open(os.path.join(d, "config.pbtxt"), "w") as f:
                f.write('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
        for engine in engines:
            start_t = time.monotonic()
            results = run_engine(a.wisp, engine, runnable, repo)
            tally = {k: sum(1 for v in results.values() if v[0] == k)
                     for k in ("pass", "refused", "error", "wrong")}
            report["engines"][engine] = {"tally": tally, "seconds": round(time.monotonic() - start_t, 1),
                                         "results": {n: list(v) for n, v in sorted(results.items())}}
            print(f"{engine}: {tally} of {len(runnable)} run, {len(skipped)} skipped "
                  f"({time.monotonic() - start_t:.0f} s)", flush=True)
            for n, (kind, why) in sorted(results.items()):
                if kind == "wrong":
                    print(f"  WRONG {n}: {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(report))
    wrong = max(e["tally"]["wrong"] for e in report["engines"].values())
    sys.exit(1 if wrong > a.max_wrong else 0)


def markdown(report):
    lines = [f"onnx {report['onnx']}: {report['cases']} node cases, {len(report['skipped'])} skipped "
             "(not tensor models Wisp can be asked).", "",
             "| engine | pass | refused at load | error at inference | wrong |", "|---|---|---|---|---|"]
    for engine, e in report["engines"].items():
        t = e["tally"]
        lines.append(f"| {engine} | {t['pass']} | {t['refused']} | {t['error']} | {t['wrong']} |")
    for engine, e in report["engines"].items():
        wrong = [(n, why) for n, (kind, why) in e["results"].items() if kind == "wrong"]
        lines += ["", f"Wrong on {engine} ({len(wrong)}):", ""]
        lines += [f"- `{n}`: {why}" for n, why in wrong] or ["- none"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
