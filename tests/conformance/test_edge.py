"""The demo pipelines give the answers recorded on x86 (`tests/fixtures/edge/demo_answers.json`),
whatever machine the binary under test was built for. `./dev cross TARGET test` runs this file
against a cross-built binary under qemu-user (`WISP_RUNNER`); `./dev test` runs it natively,
which keeps the recorded answers honest. `WISP_RECORD_DEMO_ANSWERS=1` records them anew (on x86).

Labels must match exactly; scores within 1e-3 (tract's kernels differ per architecture in the
last bits).

Under qemu-user the models' float arithmetic is emulated instruction by instruction: one
`content_type` request (Magika's 0.7 GFLOP convolution) takes about 70 s, one image about 5 s.
There the test sends two of the files (`EMULATED_FILES`), which still run every model and
kernel of the pipeline, and gives every plugin a 120-s deadline instead of its 5 s
(`relax_plugin_deadlines`); natively it sends every file with the repository's own deadlines."""
import json
import os
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EMULATED, ROOT, relax_plugin_deadlines, start_wisp, stop_wisp

ANSWERS = os.path.join(ROOT, "tests", "fixtures", "edge", "demo_answers.json")
IMAGES = os.path.join(ROOT, "tests", "fixtures", "images")

# Files of known types for the content-type pipeline.
FILES = {
    "main.py": b"import os\nimport sys\n\n\ndef main():\n    for name in sorted(os.listdir(\".\")):\n"
               b"        print(name, os.path.getsize(name))\n\n\nif __name__ == \"__main__\":\n    main()\n",
    "models.json": b"{\n  \"name\": \"wisp\",\n  \"version\": 1,\n  \"models\": [{\"id\": \"ppocr_cls\", "
                   b"\"ready\": true}, {\"id\": \"magika\", \"ready\": false}]\n}\n",
    "index.html": b"<!DOCTYPE html>\n<html>\n<head><title>Wisp</title></head>\n<body>\n<h1>Hello</h1>\n"
                  b"<p>An inference server.</p>\n</body>\n</html>\n",
    "args.c": b"#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n"
              b"        printf(\"%s\\n\", argv[i]);\n    }\n    return 0;\n}\n",
    "count.sh": b"#!/bin/sh\nset -e\nfor f in *.txt; do\n  echo \"$f\"\n  wc -l \"$f\"\ndone\n",
    "line.png": open(os.path.join(IMAGES, "text_upright.png"), "rb").read(),
    "empty.bin": b"",
    "tiny.txt": b"hi",
}

# The files sent under qemu-user: a text file and an image.
EMULATED_FILES = ["main.py", "line.png"]
# The content files left out of this run.
LEFT_OUT = [n for n in FILES if EMULATED and n not in EMULATED_FILES]

# The demo pipelines whose answers are checked here, on tract. The server serves the whole demo
# repository, as the edge quick start does: the stateful `vad` and the embeddings pipeline load
# (and must be READY) but their answers are checked elsewhere (test_sequence.py against ONNX
# Runtime, test_embeddings.py), to keep emulated runs short.
DEMO_MODELS = ["text_direction", "text_direction_bls", "content_type"]


def emulated_repo(tmp):
    """model_repo, copied, each plugin with the emulated deadline (conftest)."""
    repo = tmp / "model_repo"
    shutil.copytree(os.path.join(ROOT, "model_repo"), repo)
    relax_plugin_deadlines(repo)
    return str(repo)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`wisp serve` on the whole demo repository with tract alone (as the edge build has it),
    once `/v2/health/ready` answers 200 (start_wisp waits for it)."""
    repo = emulated_repo(tmp_path_factory.mktemp("demo")) if EMULATED else os.path.join(ROOT, "model_repo")
    proc, log, urls = start_wisp(repo, "tract", "edge-demo.log",
                                 ready_within=None if EMULATED else 120)
    yield httpclient.InferenceServerClient(urls["url"], network_timeout=600)
    stop_wisp(proc, log)


def infer_bytes(client, model, name, data, outputs):
    inp = httpclient.InferInput(name, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
    res = client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(o) for o in outputs])
    return [res.as_numpy(o).reshape(-1)[0] for o in outputs]


def answers(client):
    out = {}
    for model in ["text_direction", "text_direction_bls"]:
        for image in ["text_upright.png", "text_rotated.png"]:
            png = open(os.path.join(IMAGES, image), "rb").read()
            (direction,) = infer_bytes(client, model, "IMAGE", png, ["DIRECTION"])
            score, index, label = direction.decode().split(":")
            out[f"{model}/{image}"] = {"label": f"{index}:{label}", "score": float(score)}
    for name, data in FILES.items():
        if name in LEFT_OUT:
            continue
        label, score = infer_bytes(client, "content_type", "CONTENT", data, ["LABEL", "SCORE"])
        out[f"content_type/{name}"] = {"label": label.decode(), "score": float(score)}
    return out


def test_demo_pipelines_answer_as_on_x86(demo):
    got = answers(demo)
    if os.environ.get("WISP_RECORD_DEMO_ANSWERS"):
        with open(ANSWERS, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
    want = json.load(open(ANSWERS))
    want = {k: v for k, v in want.items() if k not in [f"content_type/{n}" for n in LEFT_OUT]}
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g = got[key]
        assert g["label"] == w["label"], f"{key}: {g} vs x86 {w}"
        assert abs(g["score"] - w["score"]) <= 1e-3, f"{key}: {g} vs x86 {w}"


def test_the_engine_is_stated_in_the_metadata(demo):
    meta = demo.get_model_metadata("magika")
    assert meta["parameters"]["engine"] == "tract", meta


def test_the_whole_demo_repository_is_ready_on_tract(demo):
    """The edge quick start: the server above is ready, and every model of the demo repository
    is READY, the stateful `vad` (whose `If` nodes tract plans once inlined) included."""
    states = {m["name"]: m.get("state") for m in demo.get_model_repository_index()}
    want = sorted(e.name for e in os.scandir(os.path.join(ROOT, "model_repo")) if e.is_dir())
    assert sorted(states) == want, states
    assert states.get("vad") == "READY", states
    assert all(s == "READY" for s in states.values()), states
