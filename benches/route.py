"""Ensembles that decide, end to end (issue 54, item 1): the demo's `file_route`, whose router
step leaves the branch not taken unset, against the taken branch alone, in one `wisp serve` of
a copy of `model_repo/` (tract).

Two ensembles beside `file_route` are added to the copy, `file_image_only` and
`file_text_only`: content_type and the one branch, reading CONTENT, no router: the floor for a
file of that kind, though not for its latency: they run content_type beside the branch,
while `file_route`'s branch waits for content_type's label, so `content_type` alone is
measured too. (An ensemble running both branches on every file cannot answer here at
all: the text tokenizer refuses a PNG's bytes, which are not UTF-8, and the image decoder
refuses text; `--unconditional` adds that ensemble, `file_both`, and shows its 400.)

A PNG text-line image goes through `file_route` and `file_image_only`, a source file through
`file_route` and `file_text_only`. Per model and concurrency (1 and 8 clients, HTTP binary
tensors over keep-alive), rounds alternating the models' order: requests per second and the
clients' p50, and from the statistics extension how many requests reached `all_minilm_l6_v2`
(the text encoder) and `ppocr_cls` (the image classifier), with their compute_infer per
request of the ensemble: the branch not taken must cost no compute. Medians over rounds. The
scheduling cost of a skipped branch alone is `cargo bench -p wisp-scheduler --bench
ensemble_route`.

    python benches/route.py --wisp target/release/wisp [--rounds 3] [--requests 64]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plugin_path as pp  # noqa: E402

ROOT = pp.ROOT
BOTH = """platform: "ensemble"
max_batch_size: 16
input [ { name: "CONTENT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] },
  { name: "DIRECTION" data_type: TYPE_STRING dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "content_type" model_version: -1
    input_map { key: "CONTENT" value: "CONTENT" } output_map { key: "LABEL" value: "LABEL" } },
  { model_name: "text_embedding" model_version: -1
    input_map { key: "TEXT" value: "CONTENT" } output_map { key: "EMBEDDING" value: "EMBEDDING" } },
  { model_name: "text_direction" model_version: -1
    input_map { key: "IMAGE" value: "CONTENT" } output_map { key: "DIRECTION" value: "DIRECTION" } }
] }
"""


def only(branch, key, out, dt, dims):
    return f"""platform: "ensemble"
max_batch_size: 16
input [ {{ name: "CONTENT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "{out}" data_type: {dt} dims: [ {dims} ] }}
]
ensemble_scheduling {{ step [
  {{ model_name: "content_type" model_version: -1
    input_map {{ key: "CONTENT" value: "CONTENT" }} output_map {{ key: "LABEL" value: "LABEL" }} }},
  {{ model_name: "{branch}" model_version: -1
    input_map {{ key: "{key}" value: "CONTENT" }} output_map {{ key: "{out}" value: "{out}" }} }}
] }}
"""


def body(data):
    header = json.dumps({"inputs": [{"name": "CONTENT", "datatype": "BYTES", "shape": [1, 1],
                                     "parameters": {"binary_data_size": len(data) + 4}}]}).encode()
    return header, header + len(data).to_bytes(4, "little") + data


def stats(port):
    """{model: (success count, compute_infer ns)} for every model."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/v2/models/stats")
    out = {}
    for s in json.loads(c.getresponse().read())["model_stats"]:
        i = s["inference_stats"]
        out[s["name"]] = (int(i["success"]["count"]), int(i["compute_infer"]["ns"]))
    return out


def client(port, model, request, n, lat, errors):
    header, payload = request
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", f"/v2/models/{model}/infer", payload,
                  {"Inference-Header-Content-Length": str(len(header))})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            errors.append(r.status)
        lat.append((time.perf_counter() - t) * 1e3)


def load(port, model, request, n, clients):
    before = stats(port)
    lats, errors = [[] for _ in range(clients)], []
    threads = [threading.Thread(target=client, args=(port, model, request, n // clients, lats[i], errors))
               for i in range(clients)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    if errors:
        sys.exit(f"{model}: {len(errors)} errors, e.g. {errors[0]}")
    after = stats(port)
    done = after[model][0] - before[model][0]

    def reached(m):
        return after[m][0] - before[m][0], (after[m][1] - before[m][1]) / max(1, done) / 1e3

    lat = sorted(x for l in lats for x in l)
    return {"rps": len(lat) / wall, "p50": lat[len(lat) // 2],
            "text": reached("all_minilm_l6_v2"), "image": reached("ppocr_cls"), "n": done}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wisp", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64, help="per model, round and concurrency")
    ap.add_argument("--unconditional", action="store_true",
                    help="also try the ensemble that runs both branches on every file")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 20 or not 8 <= args.requests <= 2000:
        sys.exit("--rounds takes 1..20, --requests 8..2000")
    scratch = tempfile.mkdtemp(prefix="wisp-route-bench-")
    repo = os.path.join(scratch, "model_repo")
    shutil.copytree(os.path.join(ROOT, "model_repo"), repo)
    for name, config in (("file_both", BOTH),
                         ("file_image_only", only("text_direction", "IMAGE", "DIRECTION", "TYPE_STRING", "1")),
                         ("file_text_only", only("text_embedding", "TEXT", "EMBEDDING", "TYPE_FP32", "384"))):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config)
    png = open(os.path.join(ROOT, "tests", "fixtures", "images", "text_upright.png"), "rb").read()
    text = open(os.path.join(ROOT, "examples", "file_route.py"), "rb").read()
    # content_type alone is the decision's own latency: file_route must wait for it before
    # either branch starts, while the taken-branch-only ensembles run it beside the branch.
    cases = [("PNG", "file_route", png), ("PNG", "file_image_only", png), ("PNG", "content_type", png),
             ("source", "file_route", text), ("source", "file_text_only", text),
             ("source", "content_type", text)]
    proc, port = pp.serve(args.wisp, repo, "tract", ready_secs=300)
    try:
        if args.unconditional:
            for kind, data in (("PNG", png), ("source", text)):
                header, payload = body(data)
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/v2/models/file_both/infer", payload,
                          {"Inference-Header-Content-Length": str(len(header))})
                r = c.getresponse()
                print(f"file_both on a {kind} file: {r.status} {r.read().decode()[:200]}")
        for _, model, data in cases:  # warm-up
            load(port, model, body(data), 8, 1)
        results = {}
        for r in range(args.rounds):
            order = cases if r % 2 == 0 else cases[::-1]
            for c in (1, 8):
                for kind, model, data in order:
                    results.setdefault((kind, model, c), []).append(
                        load(port, model, body(data), args.requests, c))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{args.rounds} rounds × {args.requests} requests per model and concurrency; medians\n")
    print("| file | ensemble | clients | req/s | p50 ms | text encoder: requests reached, compute_infer µs/request | image classifier: requests reached, compute_infer µs/request |")
    print("|---|---|---|---|---|---|---|")
    for (kind, model, c), rs in results.items():
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        tn = sum(x["text"][0] for x in rs)
        im = sum(x["image"][0] for x in rs)
        n = sum(x["n"] for x in rs)
        tc = statistics.median(x["text"][1] for x in rs)
        ic = statistics.median(x["image"][1] for x in rs)
        print(f"| {kind} | {model} | {c} | {med('rps'):.1f} | {med('p50'):.2f} | "
              f"{tn}/{n}, {tc:.0f} | {im}/{n}, {ic:.0f} |")


if __name__ == "__main__":
    main()
