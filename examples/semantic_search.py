#!/usr/bin/env python3
"""A small semantic search over a few sentences: embed them once through Wisp's
/v1/embeddings, then rank them against each query by cosine similarity (the vectors are unit
length, so a dot product).

    ./dev serve &
    .venv/bin/python examples/semantic_search.py ["your query" ...]
"""
import os
import sys

import numpy as np
import openai

DOCUMENTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "A cheetah is running behind its prey.",
    "The new movie is awesome.",
    "The server answers inference requests over HTTP and gRPC.",
]

client = openai.OpenAI(base_url=f"http://{os.environ.get('WISP_URL', 'localhost:8000')}/v1",
                       api_key="not-needed")


def embed(texts):
    r = client.embeddings.create(model="text_embedding", input=texts)
    return np.array([d.embedding for d in r.data], dtype=np.float32)


corpus = embed(DOCUMENTS)
queries = sys.argv[1:] or ["Someone is having a meal.", "A primate plays an instrument.",
                           "Which program serves models on the network?"]
for query, q in zip(queries, embed(queries)):
    scores = corpus @ q
    print(f"\n{query}")
    for i in np.argsort(-scores)[:3]:
        print(f"  {scores[i]:.3f}  {DOCUMENTS[i]}")
