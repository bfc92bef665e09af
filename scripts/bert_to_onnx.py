#!/usr/bin/env python3
"""Builds an ONNX graph of a BERT encoder (Hugging Face `BertModel`) from its `config.json` and
`model.safetensors`, with only numpy and the `onnx` package: no torch, no transformers.

    bert_to_onnx.py MODEL_DIR OUT.onnx

Inputs `input_ids`, `attention_mask`, `token_type_ids` (INT64 [batch, sequence]); output
`last_hidden_state` (FP32 [batch, sequence, hidden]). Pooling is left to the caller.

The graph spells each piece the way the Hugging Face exporter does (LayerNorm as
ReduceMean/Sub/Pow/Sqrt/Div, GELU as Div/Erf/Add/Mul), so ONNX Runtime's graph optimizer fuses
them into its LayerNormalization and Gelu kernels. scripts/fetch_models.py calls `convert`.
"""
import json
import math
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path):
    """Every tensor of a .safetensors file, as numpy arrays (the format is a little-endian u64
    header length, a JSON header of dtype/shape/offsets, then the raw data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    base = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        array = np.frombuffer(blob[base + begin : base + end], dtype=dtype)
        tensors[name] = array.reshape(info["shape"]).astype(
            np.float32 if dtype == np.float16 else dtype
        )
    # Some checkpoints prefix every name with the architecture ("bert.embeddings...").
    if all(k.startswith("bert.") for k in tensors if not k.startswith("cls.")):
        tensors = {k[len("bert.") :]: v for k, v in tensors.items()}
    return tensors


class Graph:
    """A small builder: unique node names, weights as initializers."""

    def __init__(self, weights):
        self.weights = weights
        self.nodes = []
        self.inits = []
        self.count = 0

    def name(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def op(self, kind, inputs, hint=None, **attrs):
        out = self.name(hint or kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [out], name=out + "_op", **attrs))
        return out

    def const(self, value, hint="const"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, key, transpose=False):
        array = self.weights[key]
        if transpose:
            array = np.ascontiguousarray(array.T)
        name = key.replace(".", "_") + ("_T" if transpose else "")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def linear(self, x, prefix):
        y = self.op("MatMul", [x, self.weight(prefix + ".weight", transpose=True)])
        return self.op("Add", [y, self.weight(prefix + ".bias")])

    def layer_norm(self, x, prefix, eps):
        mean = self.op("ReduceMean", [x], axes=[-1])
        centred = self.op("Sub", [x, mean])
        square = self.op("Pow", [centred, self.const(np.float32(2.0))])
        var = self.op("ReduceMean", [square], axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const(np.float32(eps))])])
        normed = self.op("Div", [centred, std])
        scaled = self.op("Mul", [normed, self.weight(prefix + ".weight")])
        return self.op("Add", [scaled, self.weight(prefix + ".bias")])

    def gelu(self, x):
        erf = self.op("Erf", [self.op("Div", [x, self.const(np.float32(math.sqrt(2.0)))])])
        one_plus = self.op("Add", [erf, self.const(np.float32(1.0))])
        return self.op("Mul", [self.op("Mul", [x, one_plus]), self.const(np.float32(0.5))])


def build(config, weights):
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head = hidden // heads
    eps = config.get("layer_norm_eps", 1e-12)
    if config.get("hidden_act", "gelu") != "gelu":
        raise SystemExit(f"bert_to_onnx: hidden_act {config['hidden_act']!r} is not supported")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit("bert_to_onnx: only absolute position embeddings are supported")
    g = Graph(weights)

    # Embeddings: words + positions 0..sequence + token types, then LayerNorm.
    words = g.op("Gather", [g.weight("embeddings.word_embeddings.weight"), "input_ids"])
    seq = g.op("Shape", ["input_ids"], start=1, end=2)
    positions = g.op(
        "Slice",
        [
            g.weight("embeddings.position_embeddings.weight"),
            g.const(np.array([0], np.int64)),
            seq,
            g.const(np.array([0], np.int64)),
        ],
    )
    types = g.op("Gather", [g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"])
    x = g.op("Add", [g.op("Add", [words, positions]), types])
    x = g.layer_norm(x, "embeddings.LayerNorm", eps)

    # The additive attention mask: 0 where attended, -10000 where padded ([batch, 1, 1, seq]).
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask = g.op("Unsqueeze", [mask, g.const(np.array([1, 2], np.int64))])
    mask = g.op("Sub", [g.const(np.float32(1.0)), mask])
    mask = g.op("Mul", [mask, g.const(np.float32(-10000.0))])

    split_heads = g.const(np.array([0, 0, heads, head], np.int64), "split_heads")
    merge_heads = g.const(np.array([0, 0, hidden], np.int64), "merge_heads")
    scale = g.const(np.float32(math.sqrt(head)), "scale")
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = g.op("Reshape", [g.linear(x, p + "attention.self.query"), split_heads])
        k = g.op("Reshape", [g.linear(x, p + "attention.self.key"), split_heads])
        v = g.op("Reshape", [g.linear(x, p + "attention.self.value"), split_heads])
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k]), scale])
        probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, merge_heads])
        attended = g.linear(context, p + "attention.output.dense")
        x = g.layer_norm(g.op("Add", [attended, x]), p + "attention.output.LayerNorm", eps)
        inner = g.gelu(g.linear(x, p + "intermediate.dense"))
        out = g.linear(inner, p + "output.dense")
        x = g.layer_norm(g.op("Add", [out, x]), p + "output.LayerNorm", eps)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))

    ids = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph(
        g.nodes,
        "bert",
        [ids("input_ids"), ids("attention_mask"), ids("token_type_ids")],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]
            )
        ],
        initializer=g.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="wisp bert_to_onnx",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def convert(model_dir, out_path):
    """Writes the ONNX encoder of the BERT checkpoint in `model_dir` to `out_path`; returns its
    size in bytes."""
    with open(f"{model_dir}/config.json") as f:
        config = json.load(f)
    if config.get("model_type", "bert") != "bert":
        raise SystemExit(f"bert_to_onnx: model_type {config['model_type']!r} is not BERT")
    model = build(config, read_safetensors(f"{model_dir}/model.safetensors"))
    data = model.SerializeToString()
    with open(out_path, "wb") as f:
        f.write(data)
    return len(data)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"{sys.argv[2]}: {convert(sys.argv[1], sys.argv[2])} bytes")
