"""Triton's QA ensemble family, rebuilt: for every datatype, `nop_<TYPE>_-1` identity models
that batch (max_batch_size 1024, dims [-1]) inside the `simple`, `sequence` and `fan`
ensembles over an add/sub model, both batching and not (`_nobatch`, max_batch_size 0, dims
[16]); zero-size tensors through a non-batching ensemble of a nop; and sequence flags carried
through a non-batching ensemble into a stateful model. A non-batching ensemble feeds a
batching step as Triton does: the step sees a batch of 1, and the answer leaves without it.

The models are generated here, the way Triton's qa/common/gen_ensemble_model_utils.py lays
them out (names, step maps, shapes), with ONNX graphs standing in for its custom identity
backend."""
import os
import shutil

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from conftest import ENGINES, ROOT, start_wisp, stop_wisp

# (config type, ONNX element type, numpy type, tritonclient datatype)
TYPES = [
    ("FP16", TensorProto.FLOAT16, np.float16, "FP16"),
    ("FP32", TensorProto.FLOAT, np.float32, "FP32"),
    ("FP64", TensorProto.DOUBLE, np.float64, "FP64"),
    ("INT8", TensorProto.INT8, np.int8, "INT8"),
    ("INT16", TensorProto.INT16, np.int16, "INT16"),
    ("INT32", TensorProto.INT32, np.int32, "INT32"),
    ("INT64", TensorProto.INT64, np.int64, "INT64"),
    ("UINT8", TensorProto.UINT8, np.uint8, "UINT8"),
    ("UINT16", TensorProto.UINT16, np.uint16, "UINT16"),
    ("BOOL", TensorProto.BOOL, np.bool_, "BOOL"),
    ("STRING", TensorProto.STRING, np.object_, "BYTES"),
]
KINDS = ["simple", "sequence", "fan"]
SEQUENCE_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "sequence", "accumulate_direct")


def tname(t):
    return "object" if t[2] is np.object_ else np.dtype(t[2]).name


def save_onnx(repo, name, nodes, elem, shape, config, n_in=2, n_out=2):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    ins = [helper.make_tensor_value_info(f"INPUT{i}", elem, shape) for i in range(n_in)]
    outs = [helper.make_tensor_value_info(f"OUTPUT{i}", elem, shape) for i in range(n_out)]
    g = helper.make_graph(nodes, name, ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, os.path.join(d, "1", "model.onnx"))
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)


def io_config(ctype, dims, n=2):
    ins = ", ".join(f'{{ name: "INPUT{i}" data_type: TYPE_{ctype} dims: [ {dims} ] }}' for i in range(n))
    outs = ", ".join(f'{{ name: "OUTPUT{i}" data_type: TYPE_{ctype} dims: [ {dims} ] }}' for i in range(n))
    return f"input [ {ins} ]\noutput [ {outs} ]\n"


def add_sub_nodes(t):
    """OUTPUT0 = a + b, OUTPUT1 = a - b (numbers, through FP64); OR/XOR for BOOL; the inputs
    unchanged for strings."""
    if t[0] == "STRING":
        return [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
                helper.make_node("Identity", ["INPUT1"], ["OUTPUT1"])]
    if t[0] == "BOOL":
        return [helper.make_node("Or", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                helper.make_node("Xor", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    d = TensorProto.DOUBLE
    return [helper.make_node("Cast", ["INPUT0"], ["a"], to=d),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=d),
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Sub", ["a", "b"], ["m"]),
            helper.make_node("Cast", ["s"], ["OUTPUT0"], to=t[1]),
            helper.make_node("Cast", ["m"], ["OUTPUT1"], to=t[1])]


def expected(t, a, b):
    if t[0] == "STRING":
        return a, b
    if t[0] == "BOOL":
        return a | b, a ^ b
    return (a.astype(np.float64) + b).astype(t[2]), (a.astype(np.float64) - b).astype(t[2])


def step(model, imap, omap):
    i = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in imap)
    o = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in omap)
    return f'{{ model_name: "{model}" model_version: -1 {i} {o} }}'


def schedule(kind, t, base):
    nop = f"nop_TYPE_{t[0]}_-1"
    io = [("INPUT0", "INPUT0"), ("INPUT1", "INPUT1")]
    if kind == "simple":
        steps = [step(base, io, [("OUTPUT0", "OUTPUT0"), ("OUTPUT1", "OUTPUT1")])]
    else:
        same_in = [("INPUT0", "same_input0"), ("INPUT1", "same_input1")]
        steps = [step(nop, io, [("OUTPUT0", "same_input0"), ("OUTPUT1", "same_input1")])]
        if kind == "sequence":
            steps.append(step(base, same_in, [("OUTPUT0", "OUTPUT0"), ("OUTPUT1", "OUTPUT1")]))
        else:
            steps.append(step(base, same_in, [("OUTPUT0", "same_output0"), ("OUTPUT1", "same_output1")]))
            for n in (0, 1):
                steps.append(step(nop, [("INPUT0", f"same_output{n}"), ("INPUT1", f"same_output{n}")],
                                  [(f"OUTPUT{n}", f"OUTPUT{n}")]))
    return "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }\n"


def build_repo(repo):
    for t in TYPES:
        identity = [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in (0, 1)]
        save_onnx(repo, f"nop_TYPE_{t[0]}_-1", identity, t[1], ["N", "D"],
                  "platform: \"onnxruntime_onnx\"\nmax_batch_size: 1024\n" + io_config(t[0], "-1"))
        name = tname(t)
        for max_batch, suffix in ((8, ""), (0, "_nobatch")):
            base = f"onnx{suffix}_{name}_{name}_{name}"
            shape = ["N", 16] if max_batch else [16]
            save_onnx(repo, base, add_sub_nodes(t), t[1], shape,
                      f"platform: \"onnxruntime_onnx\"\nmax_batch_size: {max_batch}\n" + io_config(t[0], "16"))
            for kind in KINDS:
                d = os.path.join(repo, f"{kind}_onnx{suffix}_{name}_{name}_{name}")
                os.makedirs(os.path.join(d, "1"), exist_ok=True)
                with open(os.path.join(d, "config.pbtxt"), "w") as f:
                    f.write(f'platform: "ensemble"\nmax_batch_size: {max_batch}\n'
                            + io_config(t[0], "16") + schedule(kind, t, base))
        # zero-size tensors: a non-batching ensemble of one nop, dims [-1]
        d = os.path.join(repo, f"simple_zero_nobatch_1_{t[0]}")
        os.makedirs(os.path.join(d, "1"), exist_ok=True)
        with open(os.path.join(d, "config.pbtxt"), "w") as f:
            f.write('platform: "ensemble"\nmax_batch_size: 0\n' + io_config(t[0], "-1", n=1)
                    + "ensemble_scheduling { step [ "
                    + step(f"nop_TYPE_{t[0]}_-1", [("INPUT0", "INPUT0"), ("INPUT1", "INPUT0")],
                           [("OUTPUT0", "OUTPUT0")])
                    + " ] }\n")
    # sequence flags through a non-batching ensemble: nop -> a stateful accumulator
    shutil.copytree(SEQUENCE_FIXTURE, os.path.join(repo, "accumulate_direct"))
    d = os.path.join(repo, "sequence_nobatch_accumulate")
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write('platform: "ensemble"\nmax_batch_size: 0\n'
                'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },'
                ' { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                "ensemble_scheduling { step [ "
                + step("nop_TYPE_FP32_-1", [("INPUT0", "INPUT"), ("INPUT1", "INPUT")],
                       [("OUTPUT0", "same")])
                + ", "
                + step("accumulate_direct", [("INPUT", "same")],
                       [("OUTPUT", "OUTPUT"), ("START_OUT", "START_OUT")])
                + " ] }\n")


@pytest.fixture(scope="module", params=ENGINES)
def family(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensemble_family")
    build_repo(str(repo))
    proc, log, urls = start_wisp(repo, request.param, f"conformance-ensemble-family-{request.param}.log")
    yield urls
    stop_wisp(proc, log)


def data(t, shape, seed):
    """Seed 1 draws from [20, 40) and the others from [0, 20), so a - b stays in range for
    unsigned types (ONNX leaves an out-of-range Cast undefined)."""
    rng = np.random.default_rng(seed)
    low = 20 if seed == 1 else 0
    if t[0] == "STRING":
        return np.array([str(v).encode() for v in rng.integers(0, 100, size=shape).flatten()],
                        dtype=np.object_).reshape(shape)
    if t[0] == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.integers(low, low + 20, size=shape).astype(t[2])


def infer(mod, client, model, t, arrays, **kw):
    inputs = []
    for i, a in enumerate(arrays):
        x = mod.InferInput(f"INPUT{i}", list(a.shape), t[3])
        x.set_data_from_numpy(a)
        inputs.append(x)
    return client.infer(model, inputs, **kw)


def clients(urls):
    return ((httpclient, httpclient.InferenceServerClient(url=urls["url"])),
            (grpcclient, grpcclient.InferenceServerClient(url=urls["grpc_url"])))


@pytest.mark.parametrize("t", TYPES, ids=[t[0] for t in TYPES])
def test_every_ensemble_kind_serves_each_type_batching_or_not(family, t):
    name = tname(t)
    for mod, c in clients(family):
        for kind in KINDS:
            for suffix, shape in (("_nobatch", (16,)), ("", (3, 16))):
                model = f"{kind}_onnx{suffix}_{name}_{name}_{name}"
                a, b = data(t, shape, 1), data(t, shape, 2)
                r = infer(mod, c, model, t, [a, b])
                want0, want1 = expected(t, a, b)
                for out, want in (("OUTPUT0", want0), ("OUTPUT1", want1)):
                    got = r.as_numpy(out)
                    assert got.shape == shape, f"{model} {out}: {got.shape}"
                    np.testing.assert_array_equal(got, want, err_msg=f"{model} {out}")


@pytest.mark.parametrize("t", TYPES, ids=[t[0] for t in TYPES])
def test_zero_size_tensors_pass_a_non_batching_ensemble(family, t):
    for mod, c in clients(family):
        for n in (0, 5):
            a = data(t, (n,), 3)
            r = infer(mod, c, f"simple_zero_nobatch_1_{t[0]}", t, [a])
            got = r.as_numpy("OUTPUT0")
            assert got.shape == (n,)
            np.testing.assert_array_equal(got, a)


def test_sequence_flags_pass_through_a_non_batching_ensemble(family):
    for mod, c in clients(family):
        seq = 7001 if mod is httpclient else 7002
        total = 0.0
        for i, v in enumerate((1.0, 2.0, 4.0)):
            x = np.array([v], dtype=np.float32)
            inp = mod.InferInput("INPUT", [1], "FP32")
            inp.set_data_from_numpy(x)
            r = c.infer("sequence_nobatch_accumulate", [inp], sequence_id=seq,
                        sequence_start=(i == 0), sequence_end=(i == 2))
            total += v
            assert r.as_numpy("OUTPUT").shape == (1,)
            assert r.as_numpy("OUTPUT")[0] == total, "the accumulator kept the sequence's state"
            assert r.as_numpy("START_OUT")[0] == (1 if i == 0 else 0)
