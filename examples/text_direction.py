#!/usr/bin/env python3
"""Send a text-line image through Wisp's text-direction pipelines with NVIDIA's tritonclient.

    ./dev serve &                      # serves model_repo/ on :8000
    .venv/bin/python examples/text_direction.py [IMAGE ...]

Each image goes to the `text_direction` ensemble (wasm pre-processing → PP-OCR direction
classifier → wasm post-processing) and to its BLS twin `text_direction_bls` (one wasm plugin
calling the classifier through wasi-nn); both answer "score:index:label" with label 0 or 180.
"""
import os
import sys

import numpy as np
import tritonclient.http as httpclient

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = [os.path.join(HERE, "..", "tests", "fixtures", "images", name)
           for name in ("text_upright.png", "text_rotated.png")]


def direction(client, model, image_bytes):
    inp = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[image_bytes]], dtype=np.object_), binary_data=True)
    out = httpclient.InferRequestedOutput("DIRECTION", binary_data=False)
    result = client.infer(model, [inp], outputs=[out])
    return result.as_numpy("DIRECTION").reshape(-1)[0]


def main():
    url = os.environ.get("WISP_URL", "localhost:8000")
    client = httpclient.InferenceServerClient(url)
    for path in sys.argv[1:] or DEFAULT:
        with open(path, "rb") as f:
            data = f.read()
        for model in ("text_direction", "text_direction_bls"):
            answer = direction(client, model, data)
            if isinstance(answer, bytes):
                answer = answer.decode()
            score, _, label = answer.split(":")
            print(f"{os.path.basename(path)}: {model}: rotated {label} degrees (score {float(score):.3f})")


if __name__ == "__main__":
    main()
