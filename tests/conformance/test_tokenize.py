"""The `tokenize` plugin (Hugging Face's `tokenizers` crate inside wasm) against the Python
`tokenizers` package on a committed corpus (tests/fixtures/text/corpus.txt: unicode, accents,
CJK, emoji, control characters, empty and very long lines), with all-MiniLM-L6-v2's
tokenizer.json: ids, attention masks and type ids must be identical."""
import os
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from conftest import EMULATED, ROOT, relax_plugin_deadlines, start_wisp, stop_wisp

MODEL = os.path.join(ROOT, "model_repo", "text_tokenize")
MAX_LENGTH = 256  # model_repo/text_tokenize/config.pbtxt
PAD_MULTIPLE = 8  # its pad_to_multiple_of


def corpus():
    with open(os.path.join(ROOT, "tests", "fixtures", "text", "corpus.txt"), encoding="utf-8",
              newline="\n") as f:
        # split on \n only: the corpus holds other characters Python calls line breaks
        return f.read().split("\n")[:-1]


@pytest.fixture(scope="module")
def tokenize_server(tmp_path_factory):
    for f in ["1/model.wasm", "data/tokenizer.json"]:
        if not os.path.isfile(os.path.join(MODEL, f)):
            pytest.fail(f"model_repo/text_tokenize/{f} is missing: run ./dev test (it fetches "
                        "the tokenizer and installs the plugin)")
    repo = tmp_path_factory.mktemp("tokenize_repo")
    shutil.copytree(MODEL, os.path.join(repo, "text_tokenize"))
    if EMULATED:
        relax_plugin_deadlines(repo)
    proc, log, urls = start_wisp(repo, "tract", "conformance-tokenize.log")
    yield urls
    stop_wisp(proc, log)


def reference(lines):
    tok = Tokenizer.from_file(os.path.join(MODEL, "data", "tokenizer.json"))
    tok.enable_truncation(MAX_LENGTH)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=PAD_MULTIPLE)
    enc = tok.encode_batch(lines, add_special_tokens=True)
    return (np.array([e.ids for e in enc], dtype=np.int64),
            np.array([e.attention_mask for e in enc], dtype=np.int64),
            np.array([e.type_ids for e in enc], dtype=np.int64))


def tokenize(client, lines):
    data = np.array([[l.encode("utf-8")] for l in lines], dtype=np.object_)
    inp = httpclient.InferInput("TEXT", [len(lines), 1], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    r = client.infer("text_tokenize", [inp])
    return r.as_numpy("input_ids"), r.as_numpy("attention_mask"), r.as_numpy("token_type_ids")


@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_ids_match_the_python_package_on_the_corpus(tokenize_server, chunk):
    lines = corpus()
    assert len(lines) >= 200
    c = httpclient.InferenceServerClient(url=tokenize_server["url"])
    for start in range(0, len(lines), chunk):
        part = lines[start:start + chunk]
        got = tokenize(c, part)
        want = reference(part)
        for name, g, w in zip(["input_ids", "attention_mask", "token_type_ids"], got, want):
            assert g.shape == w.shape, (start, name, g.shape, w.shape)
            bad = np.nonzero((g != w).any(axis=1))[0]
            assert bad.size == 0, f"{name} differs on lines {[start + int(i) for i in bad][:5]}"


def test_long_inputs_are_truncated_and_bad_text_is_refused(tokenize_server):
    c = httpclient.InferenceServerClient(url=tokenize_server["url"])
    ids, mask, _ = tokenize(c, ["word " * 5000])
    assert ids.shape == (1, MAX_LENGTH) and mask.sum() == MAX_LENGTH
    assert ids[0, 0] == 101 and ids[0, -1] == 102, "[CLS] … [SEP] kept"
    inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"\xff\xfe bad"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        c.infer("text_tokenize", [inp])
    assert "TEXT element 0 is not UTF-8" in str(e.value)
