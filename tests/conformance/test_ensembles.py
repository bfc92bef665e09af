"""Ensembles as Triton runs them, through NVIDIA's real clients: steps that differ in batching
(all four combinations, chained and nested), labels of a composing model on an ensemble
output, and steps that no requested output needs left unrun."""
import os
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ENGINES, ROOT, start_wisp, stop_wisp

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "repo")


def io(names, dims):
    return ",\n".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: {dims} }}' for n in names)


def model(repo, name, config, source=None):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    if source:
        shutil.copy(os.path.join(FIXTURES, source, "1", "model.onnx"), os.path.join(d, "1", "model.onnx"))
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)


def step(name, inputs, outputs):
    imap = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    omap = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{name}" model_version: -1 {imap} {omap} }}'


def ensemble(repo, name, max_batch, steps, inputs=("INPUT0", "INPUT1"), outputs=("OUTPUT0", "OUTPUT1")):
    dims = "[ 16 ]" if max_batch > 0 else "[ -1, 16 ]"
    model(repo, name, f"""platform: "ensemble"
max_batch_size: {max_batch}
input [ {io(inputs, dims)} ]
output [ {io(outputs, dims)} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
""")


ADD_SUB = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
COMBINATIONS = {
    # ensemble batches / composing model batches
    "ens_bb": (8, "add_sub"),
    "ens_bn": (8, "add_sub_nobatch"),
    "ens_nb": (0, "add_sub"),
    "ens_nn": (0, "add_sub_nobatch"),
}


def build_repo(repo):
    shutil.copytree(os.path.join(FIXTURES, "add_sub"), os.path.join(repo, "add_sub"))
    model(repo, "add_sub_nobatch", f"""platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {io(["INPUT0", "INPUT1"], "[ -1, 16 ]")} ]
output [ {io(["OUTPUT0", "OUTPUT1"], "[ -1, 16 ]")} ]
""", source="add_sub")
    for name, (max_batch, composing) in COMBINATIONS.items():
        ensemble(repo, name, max_batch, [step(composing, *ADD_SUB)])
    # a non-batching step feeding a batching one: (a+b, a-b) -> (2a, 2b)
    ensemble(repo, "ens_chain", 4, [
        step("add_sub_nobatch", ADD_SUB[0], {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
        step("add_sub", {"INPUT0": "sum", "INPUT1": "diff"}, ADD_SUB[1]),
    ])
    # sorts before what it composes, and batches differently from it
    ensemble(repo, "a_nested", 0, [step("ens_bn", *ADD_SUB)])
    # two independent branches, for pruning
    ensemble(repo, "ens_branches", 0, [
        step("add_sub_nobatch", ADD_SUB[0], {"OUTPUT0": "OUTPUT0", "OUTPUT1": "unused"}),
        step("add_sub", ADD_SUB[0], {"OUTPUT0": "unused2", "OUTPUT1": "OUTPUT1"}),
    ])
    # a composing model that batches less than the ensemble: refused at load, as Triton does
    ensemble(repo, "ens_too_wide", 16, [step("add_sub", *ADD_SUB)])
    # labels come from the composing model that produces the output
    shutil.copytree(os.path.join(FIXTURES, "classifier"), os.path.join(repo, "classifier"))
    model(repo, "ens_classify", """platform: "ensemble"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "classifier" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "probs" value: "probs" } } ] }
""")


@pytest.fixture(scope="module", params=ENGINES)
def ensembles(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensembles")
    build_repo(str(repo))
    proc, log, urls = start_wisp(repo, request.param, f"conformance-ensembles-{request.param}.log",
                                 ["--strict-readiness=false"])
    yield urls
    stop_wisp(proc, log)


def run(client_mod, client, name, a, b, outputs=None):
    inputs = [client_mod.InferInput("INPUT0", list(a.shape), "FP32"),
              client_mod.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    requested = [client_mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(name, inputs, outputs=requested)


def pair(batch=3):
    rng = np.random.default_rng(batch)
    return (rng.standard_normal((batch, 16)).astype(np.float32),
            rng.standard_normal((batch, 16)).astype(np.float32))


@pytest.mark.parametrize("name", sorted(COMBINATIONS) + ["a_nested"])
def test_every_batching_combination_serves_over_http_and_grpc(ensembles, name):
    a, b = pair()
    h = httpclient.InferenceServerClient(url=ensembles["url"])
    g = grpcclient.InferenceServerClient(url=ensembles["grpc_url"])
    try:
        assert h.is_model_ready(name)
        for mod, c in ((httpclient, h), (grpcclient, g)):
            r = run(mod, c, name, a, b)
            np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
            np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
            assert r.as_numpy("OUTPUT0").shape == (3, 16)
    finally:
        g.close()


def test_a_non_batching_step_feeds_a_batching_one(ensembles):
    a, b = pair(4)
    c = httpclient.InferenceServerClient(url=ensembles["url"])
    r = run(httpclient, c, "ens_chain", a, b)
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), 2 * a, rtol=1e-5)
    np.testing.assert_allclose(r.as_numpy("OUTPUT1"), 2 * b, rtol=1e-5)


def test_a_batch_over_the_composing_models_limit_is_refused(ensembles):
    # ens_nb does not batch, so it takes a first dimension of 9; add_sub takes at most 8
    a, b = pair(9)
    c = httpclient.InferenceServerClient(url=ensembles["url"])
    with pytest.raises(Exception) as e:
        run(httpclient, c, "ens_nb", a, b)
    assert "add_sub" in str(e.value)


def test_a_composing_model_batching_less_than_the_ensemble_is_refused_at_load(ensembles):
    c = httpclient.InferenceServerClient(url=ensembles["url"])
    assert not c.is_model_ready("ens_too_wide")
    rows = [r for r in c.get_model_repository_index() if r["name"] == "ens_too_wide"]
    assert rows, "the index lists the refused ensemble"
    assert ("ensemble ens_too_wide allows maximum batch size 16, but it contains model add_sub "
            "which only allows maximum batch size to be 8") in rows[0]["reason"]


def test_classification_on_an_ensemble_output_uses_the_producers_labels(ensembles):
    x = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
    for mod, url in ((httpclient, ensembles["url"]), (grpcclient, ensembles["grpc_url"])):
        c = mod.InferenceServerClient(url=url)
        inp = mod.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(x)
        direct = c.infer("classifier", [inp], outputs=[mod.InferRequestedOutput("probs", class_count=2)])
        via = c.infer("ens_classify", [inp], outputs=[mod.InferRequestedOutput("probs", class_count=2)])
        got = via.as_numpy("probs")
        np.testing.assert_array_equal(got, direct.as_numpy("probs"))
        labels = {s.decode().split(":")[2] for s in got.flatten()}
        assert labels <= {"cat", "dog", "bird", "fish"}, got


def inference_count(client, name):
    stats = client.get_inference_statistics(name)["model_stats"]
    return sum(int(s["inference_count"]) for s in stats)


def test_steps_no_requested_output_needs_are_not_run(ensembles):
    a, b = pair(2)
    c = httpclient.InferenceServerClient(url=ensembles["url"])
    batching_before = inference_count(c, "add_sub")
    plain_before = inference_count(c, "add_sub_nobatch")
    r = run(httpclient, c, "ens_branches", a, b, outputs=["OUTPUT0"])
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    assert r.as_numpy("OUTPUT1") is None
    assert inference_count(c, "add_sub") == batching_before, "the pruned step ran"
    assert inference_count(c, "add_sub_nobatch") > plain_before
    # asking for everything runs both branches
    r = run(httpclient, c, "ens_branches", a, b)
    np.testing.assert_allclose(r.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert inference_count(c, "add_sub") > batching_before


def compute_ns(client, name):
    stats = client.get_inference_statistics(name)["model_stats"][0]["inference_stats"]
    return {k: int(stats[k].get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output")}


def test_the_ensembles_compute_statistics_are_its_steps(ensembles):
    c = httpclient.InferenceServerClient(url=ensembles["url"])
    a, b = pair(2)
    ens_before, step_before = compute_ns(c, "ens_nn"), compute_ns(c, "add_sub_nobatch")
    run(httpclient, c, "ens_nn", a, b)
    ens_after, step_after = compute_ns(c, "ens_nn"), compute_ns(c, "add_sub_nobatch")
    for k in ens_before:
        step = step_after[k] - step_before[k]
        assert ens_after[k] - ens_before[k] == step, (k, ens_before, ens_after, step)
    assert step_after["compute_infer"] > step_before["compute_infer"]
