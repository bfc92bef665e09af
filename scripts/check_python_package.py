"""The Python package as a user installs it: a fresh virtual environment, `pip install
./host/python` (maturin builds the extension in release mode), then the `import wisp` example
of docs/plugins.md run as written against the demo repository, with its answers checked.
`./dev test package` runs this; it takes minutes (a release build), so it is a release
check rather than a CI step.

    python scripts/check_python_package.py [--python python3] [--keep DIR]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = '''
import numpy as np
assert out["OUTPUT0"].shape == (1, 16) and out["OUTPUT0"].dtype == np.float32, out
assert (out["OUTPUT0"] == 2).all() and (out["OUTPUT1"] == 0).all(), out
print("answers: OUTPUT0", out["OUTPUT0"][0, :4].tolist(), "OUTPUT1", out["OUTPUT1"][0, :4].tolist())
'''


def docs_example():
    """The first python block after the `import wisp` heading of docs/plugins.md."""
    with open(os.path.join(ROOT, "docs", "plugins.md"), encoding="utf-8") as f:
        text = f.read()
    at = text.index("### From Python: `import wisp`")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, at)
    if not m or "import wisp" not in m.group(1):
        sys.exit("docs/plugins.md: no `import wisp` example after its heading")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="python3", help="the interpreter the venv is made from")
    ap.add_argument("--keep", help="make the venv here and keep it (default: a temporary one)")
    args = ap.parse_args()
    example = docs_example()
    venv = args.keep or tempfile.mkdtemp(prefix="wisp-pip-")
    try:
        subprocess.run([args.python, "-m", "venv", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        t = time.time()
        subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        os.path.join(ROOT, "host", "python")], check=True, timeout=3600)
        print(f"pip install ./host/python: {time.time() - t:.0f} s")
        # Run where a user of the docs would: the repository's root, which holds model_repo/.
        # The venv has no onnxruntime, so the example runs on tract (the fresh-machine case).
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "ORT_DYLIB_PATH", "WISP_PYTHON")}
        env["WISP_PYTHON"] = py
        r = subprocess.run([py, "-c", example + CHECKS], cwd=ROOT, env=env, timeout=600,
                           capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            sys.exit(f"the docs' example failed (exit {r.returncode})")
        where = subprocess.run([py, "-c", "import wisp, os; print(os.path.dirname(wisp.__file__))"],
                               cwd="/", capture_output=True, text=True, check=True).stdout.strip()
        assert where.startswith(venv), f"wisp imported from {where}, not the venv"
        print(f"ok: the package installed into {venv} runs the docs' example")
    finally:
        if not args.keep:
            shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    main()
