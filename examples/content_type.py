#!/usr/bin/env python3
"""Ask Wisp's content_type ensemble (Magika: wasm feature extractor → ONNX model → wasm label
mapper) what kind of file each argument is, with NVIDIA's tritonclient.

    ./dev serve &
    .venv/bin/python examples/content_type.py FILE [FILE ...]
"""
import os
import sys

import numpy as np
import tritonclient.http as httpclient


def main():
    client = httpclient.InferenceServerClient(os.environ.get("WISP_URL", "localhost:8000"))
    paths = sys.argv[1:] or [__file__]
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        inp = httpclient.InferInput("CONTENT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
        outs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("LABEL", "SCORE")]
        result = client.infer("content_type", [inp], outputs=outs)
        label = result.as_numpy("LABEL").reshape(-1)[0]
        label = label.decode() if isinstance(label, bytes) else label
        score = float(result.as_numpy("SCORE").reshape(-1)[0])
        print(f"{path}: {label} (score {score:.3f})")


if __name__ == "__main__":
    main()
