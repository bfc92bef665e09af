#!/usr/bin/env python3
"""Embeddings from Wisp with the official `openai` client library: Wisp's POST /v1/embeddings
serves the `text_embedding` ensemble (tokenizer in wasm → all-MiniLM-L6-v2 → pooling in wasm).

    ./dev serve &
    .venv/bin/python examples/embeddings.py ["some text" ...]
"""
import os
import sys

import openai

client = openai.OpenAI(base_url=f"http://{os.environ.get('WISP_URL', 'localhost:8000')}/v1",
                       api_key="not-needed")

print("models:", [m.id for m in client.models.list()])
texts = sys.argv[1:] or ["Wisp serves models.", "Inference at the edge, sandboxed."]
r = client.embeddings.create(model="text_embedding", input=texts)
for text, item in zip(texts, r.data):
    v = item.embedding
    print(f"{text!r}: {len(v)} dimensions, starts {[round(x, 4) for x in v[:4]]}")
print(f"usage: {r.usage.prompt_tokens} tokens")
