"""The `text_embedding` ensemble (tokenize in wasm → all-MiniLM-L6-v2 in ONNX Runtime → pool
in wasm) against reference vectors that sentence-transformers itself computed
(tests/fixtures/text/embeddings.json, made by scripts/embedding_reference.py), over KServe v2;
and 32 concurrent clients with dynamic batching on, each checking it got its own vectors."""
import json
import os
import shutil
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tokenizers import Tokenizer

from conftest import ROOT, start_wisp, stop_wisp

MODELS = ["text_tokenize", "all_minilm_l6_v2", "text_pool", "text_embedding"]
NEEDED = ["text_tokenize/1/model.wasm", "text_tokenize/data/tokenizer.json",
          "all_minilm_l6_v2/1/model.onnx", "text_pool/1/model.wasm"]


def reference():
    with open(os.path.join(ROOT, "tests", "fixtures", "text", "embeddings.json"),
              encoding="utf-8") as f:
        ref = json.load(f)
    texts = [s["text"] for s in ref["sentences"]]
    return texts, np.array([s["embedding"] for s in ref["sentences"]], dtype=np.float64)


def token_counts(texts):
    tok = Tokenizer.from_file(os.path.join(ROOT, "model_repo", "text_tokenize", "data",
                                           "tokenizer.json"))
    tok.enable_truncation(256)
    tok.no_padding()  # the file pads to 128; the plugin pads to the longest of a batch
    return [len(e.ids) for e in tok.encode_batch(texts)]


def copy_models(repo):
    for f in NEEDED:
        if not os.path.isfile(os.path.join(ROOT, "model_repo", f)):
            pytest.fail(f"model_repo/{f} is missing: run ./dev test (it fetches and converts the "
                        "model and installs the plugins)")
    for m in MODELS:
        shutil.copytree(os.path.join(ROOT, "model_repo", m), os.path.join(repo, m))


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("embedding_repo")
    copy_models(repo)
    proc, log, urls = start_wisp(repo, "onnxruntime", "conformance-embeddings.log")
    yield urls
    stop_wisp(proc, log)


def embed(client, texts):
    inp = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_))
    r = client.infer("text_embedding", [inp])
    return r.as_numpy("EMBEDDING"), r.as_numpy("TOKENS")


def cosines(a, b):
    a = np.asarray(a, dtype=np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("chunk", [1, 5, 19])
def test_ensemble_matches_sentence_transformers(embedding_server, chunk):
    texts, want = reference()
    counts = token_counts(texts)
    c = httpclient.InferenceServerClient(url=embedding_server["url"])
    for start in range(0, len(texts), chunk):
        got, tokens = embed(c, texts[start:start + chunk])
        assert got.shape == (len(texts[start:start + chunk]), 384)
        assert got.dtype == np.float32
        cos = cosines(got, want[start:start + chunk])
        assert cos.min() >= 0.9999, (start, cos)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert tokens.reshape(-1).tolist() == counts[start:start + chunk]


def test_32_concurrent_clients_get_their_own_embeddings(embedding_server):
    texts, want = reference()
    c = httpclient.InferenceServerClient(url=embedding_server["url"])
    before = c.get_inference_statistics("all_minilm_l6_v2")["model_stats"][0]
    errors = []

    def client(i):
        try:
            own = httpclient.InferenceServerClient(url=embedding_server["url"])
            for k in range(6):  # bounded: 32 × 6 requests
                j = (i + k) % len(texts)
                got, _ = embed(own, [texts[j]])
                cos = cosines(got, want[j:j + 1])[0]
                if cos < 0.9999:
                    errors.append(f"client {i} request {k}: text {j} cosine {cos}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, errors[:5]
    after = c.get_inference_statistics("all_minilm_l6_v2")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32 * 6
    assert executions < inferences, "the encoder never batched requests together"
