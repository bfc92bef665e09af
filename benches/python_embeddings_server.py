#!/usr/bin/env python3
"""What a user would otherwise write: the text-embedding pipeline in one Python process — the
`tokenizers` package, ONNX Runtime and numpy pooling behind a minimal threaded HTTP server with
an OpenAI-style POST /v1/embeddings. The `embeddings` suite of `./dev bench` runs it beside Wisp
as baseline (d).

    python_embeddings_server.py MODEL.onnx TOKENIZER.json [MAX_LENGTH]

Listens on 127.0.0.1 on a free port and prints `port N` once ready.
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


def main():
    model, tokenizer_file = sys.argv[1], sys.argv[2]
    max_length = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(tokenizer_file)
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()  # to the longest text of a request

    def embed(texts):
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (hidden,) = session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
        )
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return pooled, int(mask.sum())

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes: without this, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every keep-alive request.
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            vectors, tokens = embed(texts)
            answer = json.dumps({
                "object": "list",
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                         for i, v in enumerate(vectors)],
                "model": body.get("model", ""),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
