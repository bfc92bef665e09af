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


def run_clients(n, client):
    """Runs `client(i)` for i in 0..n on n threads at once; each must finish within 120 s."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client hung"


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

    run_clients(32, client)
    assert not errors, errors[:5]
    after = c.get_inference_statistics("all_minilm_l6_v2")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32 * 6
    assert executions < inferences, "the encoder never batched requests together"


# --- The OpenAI-compatible API, driven by the real `openai` client library -------------------

def openai_client(server):
    import openai
    return openai.OpenAI(base_url=f"http://{server['url']}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_openai_single_input_and_usage(embedding_server):
    texts, want = reference()
    client = openai_client(embedding_server)
    r = client.embeddings.create(model="text_embedding", input=texts[0])
    assert r.object == "list" and r.model == "text_embedding"
    assert len(r.data) == 1 and r.data[0].index == 0 and r.data[0].object == "embedding"
    assert cosines([r.data[0].embedding], want[:1])[0] >= 0.9999
    assert r.usage.prompt_tokens == r.usage.total_tokens == token_counts(texts[:1])[0]


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_batch_input(embedding_server, encoding):
    texts, want = reference()
    texts, want = texts[2:], want[2:]  # no empty text: the API refuses those
    client = openai_client(embedding_server)
    r = client.embeddings.create(model="text_embedding", input=texts, encoding_format=encoding)
    assert [d.index for d in r.data] == list(range(len(texts)))
    if encoding == "base64":  # asked for explicitly, the client hands the strings back as they are
        import base64
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
                        for d in r.data], dtype=np.float64)
    else:
        got = np.array([d.embedding for d in r.data], dtype=np.float64)
    assert got.shape == (len(texts), 384)
    assert cosines(got, want).min() >= 0.9999
    assert r.usage.prompt_tokens == sum(token_counts(texts))


def test_openai_base64_is_little_endian_f32(embedding_server):
    import base64
    import urllib.request
    body = json.dumps({"model": "text_embedding", "input": ["Hello world"],
                       "encoding_format": "base64"}).encode()
    req = urllib.request.Request(f"http://{embedding_server['url']}/v1/embeddings", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.load(resp)
    vec = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    _, want = reference()
    assert vec.shape == (384,) and cosines([vec], want[:1])[0] >= 0.9999


def test_openai_lists_models(embedding_server):
    client = openai_client(embedding_server)
    ids = [m.id for m in client.models.list()]
    assert ids == ["text_embedding"], "only models whose config joins the API are listed"
    m = client.models.retrieve("text_embedding")
    assert m.id == "text_embedding" and m.owned_by == "wisp" and m.created > 1.7e9


def test_openai_errors(embedding_server):
    import openai
    client = openai_client(embedding_server)
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="no_such_model", input="hi")
    assert e.value.code == "model_not_found" and "no_such_model" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="all_minilm_l6_v2", input="hi")  # served, but not here
    for empty in ["", [], ["fine", ""]]:
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model="text_embedding", input=empty)
        assert e.value.status_code == 400 and e.value.param == "input", empty
        assert e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="text_embedding", input="hi", dimensions=64)
    assert e.value.param == "dimensions" and "384" in e.value.message
    # The model's own size is fine.
    r = client.embeddings.create(model="text_embedding", input="hi", dimensions=384)
    assert len(r.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="text_embedding", input=[[101, 102]])
    assert e.value.param == "input" and "token ids" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no_such_model")
    # A wrong method: 405 with Allow, in OpenAI's error object.
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{embedding_server['url']}/v1/embeddings", timeout=10)
    assert e.value.code == 405 and e.value.headers["Allow"] == "POST"
    assert json.loads(e.value.read())["error"]["code"] == "method_not_allowed"


def test_openai_over_long_input_is_truncated_to_the_configured_length(embedding_server):
    texts, want = reference()
    longest = max(range(len(texts)), key=lambda i: len(texts[i]))
    client = openai_client(embedding_server)
    r = client.embeddings.create(model="text_embedding", input=texts[longest])
    assert r.usage.prompt_tokens == 256, "max_length of model_repo/text_tokenize"
    assert cosines([r.data[0].embedding], want[longest:longest + 1])[0] >= 0.9999
    r = client.embeddings.create(model="text_embedding", input="word " * 20000)
    assert r.usage.prompt_tokens == 256


def test_openai_counts_in_statistics_and_metrics(embedding_server):
    c = httpclient.InferenceServerClient(url=embedding_server["url"])
    before = c.get_inference_statistics("text_embedding")["model_stats"][0]
    openai_client(embedding_server).embeddings.create(model="text_embedding", input=["a", "b"])
    after = c.get_inference_statistics("text_embedding")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["inference_stats"]["success"]["count"] > before["inference_stats"]["success"]["count"]


def test_32_concurrent_openai_clients_get_their_own_embeddings(embedding_server):
    texts, want = reference()
    keep = [i for i, t in enumerate(texts) if t]
    errors = []

    def client(i):
        try:
            own = openai_client(embedding_server)
            for k in range(4):  # bounded: 32 × 4 requests of 1 to 3 texts
                picks = [keep[(i * 3 + k + j) % len(keep)] for j in range(1 + (i + k) % 3)]
                r = own.embeddings.create(model="text_embedding", input=[texts[j] for j in picks])
                got = np.array([d.embedding for d in r.data], dtype=np.float64)
                cos = cosines(got, want[picks])
                if got.shape[0] != len(picks) or cos.min() < 0.9999:
                    errors.append(f"client {i} request {k}: texts {picks} cosines {cos}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e!r}")

    run_clients(32, client)
    assert not errors, errors[:5]


def test_openai_large_request_is_chunked_in_order(embedding_server):
    # 300 texts (over 64 KiB of JSON, more than one batch of 64): every vector comes back in
    # its text's place.
    texts = [f"sentence number {i} about topic {i % 7}, " * 8 for i in range(300)]
    assert len(json.dumps(texts)) > 64 * 1024
    client = openai_client(embedding_server)
    r = client.embeddings.create(model="text_embedding", input=texts)
    assert [d.index for d in r.data] == list(range(300))
    for k in [0, 63, 64, 150, 299]:
        alone = client.embeddings.create(model="text_embedding", input=texts[k]).data[0].embedding
        assert cosines([r.data[k].embedding], np.array([alone]))[0] >= 0.9999, k
    assert r.usage.prompt_tokens == sum(token_counts(texts))
