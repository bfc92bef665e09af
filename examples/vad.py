#!/usr/bin/env python3
"""Stream audio through Wisp's stateful `vad` model (sequence batching) over a gRPC stream and
print where speech is. Each file is one sequence: the server keeps the model's recurrent state
between its frames, so the client sends audio only.

    ./dev serve &
    .venv/bin/python examples/vad.py FILE.wav [FILE.wav ...]   # 16 kHz mono, 16-bit PCM

Without a file it streams a generated clip: noise, a voiced tone burst, noise.
"""
import os
import queue
import sys
import wave

import numpy as np
import tritonclient.grpc as grpcclient

RATE, FRAME, CONTEXT = 16000, 512, 64


def read_wav(path):
    with wave.open(path, "rb") as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            sys.exit(f"{path}: need 16 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768


def generated():
    rng = np.random.default_rng(0)
    audio = rng.normal(0, 0.002, 3 * RATE).astype(np.float32)
    t = np.arange(RATE) / RATE
    audio[RATE:2 * RATE] += (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return audio


def main():
    client = grpcclient.InferenceServerClient(os.environ.get("WISP_GRPC_URL", "localhost:8001"))
    clips = [(p, read_wav(p)) for p in sys.argv[1:]] or [("generated clip", generated())]
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for seq_id, (name, audio) in enumerate(clips, start=1):
        audio = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
        frames = (audio.size - CONTEXT) // FRAME
        for k in range(frames):
            window = audio[k * FRAME: k * FRAME + CONTEXT + FRAME].reshape(1, -1)
            inp = grpcclient.InferInput("audio_with_context", [1, CONTEXT + FRAME], "FP32")
            inp.set_data_from_numpy(window)
            client.async_stream_infer("vad", [inp], request_id=str(k), sequence_id=seq_id,
                                      sequence_start=k == 0, sequence_end=k == frames - 1)
        speech, start = [], None
        for _ in range(frames):
            result, error = results.get(timeout=30)
            if error is not None:
                sys.exit(f"{name}: {error}")
            k = int(result.get_response().id)
            on = float(result.as_numpy("probability")[0]) >= 0.5
            if on and start is None:
                start = k
            if not on and start is not None:
                speech.append((start, k))
                start = None
        if start is not None:
            speech.append((start, frames))
        spans = ", ".join(f"{a * FRAME / RATE:.2f}-{b * FRAME / RATE:.2f} s" for a, b in speech)
        print(f"{name}: speech at {spans or 'nowhere'}")
    client.stop_stream()


if __name__ == "__main__":
    main()
