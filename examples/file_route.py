#!/usr/bin/env python3
"""Send files through Wisp's file_route ensemble, whose router step decides which branch runs:
text and source code get a sentence embedding, PNG/JPEG text-line images a text direction, and
the branch not taken does not run. Uses NVIDIA's tritonclient.

    ./dev serve &
    .venv/bin/python examples/file_route.py FILE [FILE ...]
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
        # No outputs named: the response holds the ones the branch that ran produced.
        result = client.infer("file_route", [inp])
        names = [o["name"] for o in result.get_response()["outputs"]]
        label = result.as_numpy("LABEL").reshape(-1)[0].decode()
        if "EMBEDDING" in names:
            e = result.as_numpy("EMBEDDING").reshape(-1)
            print(f"{path}: {label} -> text branch, embedding of {e.size} (first {e[0]:+.4f})")
        elif "DIRECTION" in names:
            d = result.as_numpy("DIRECTION").reshape(-1)[0].decode()
            print(f"{path}: {label} -> image branch, direction {d.rsplit(':', 1)[1]} degrees")
        else:
            print(f"{path}: {label} -> no branch (the router set no output)")


if __name__ == "__main__":
    main()
