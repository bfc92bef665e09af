"""`wisp plugin`: for each language, `new` scaffolds a project that `build` turns into a
repository entry, `check` accepts, and `run` executes; the Python scaffold's own test passes."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

WISP = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))


def wisp(*args, cwd=None):
    env = dict(os.environ, WISP_ROOT=ROOT,
               # a scaffolded Rust plugin builds its dependencies once per test run here
               CARGO_TARGET_DIR=os.path.join(ROOT, "target", "plugin-cli"))
    r = subprocess.run([WISP, "plugin", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=600)
    return r


@pytest.mark.parametrize("lang", ["rust", "python", "js"])
def test_new_build_check_run(tmp_path, lang):
    name = f"shout-{lang}"
    r = wisp("new", name, "--lang", lang, "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    project = tmp_path / name
    assert (project / "config.pbtxt").is_file()
    if lang == "python":
        t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
                           cwd=project, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=f"{ROOT}/sdk/python:."))
        assert t.returncode == 0, t.stdout + t.stderr
    repo = tmp_path / "repo"
    r = wisp("build", str(project), "--out", str(repo))
    assert r.returncode == 0, r.stdout + r.stderr
    model = repo / name.replace("-", "_")
    wasm = model / "1" / "model.wasm"
    assert wasm.is_file() and (model / "config.pbtxt").is_file()
    r = wisp("check", str(wasm))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world: wisp:plugin@0.2.0" in r.stdout and r.stdout.strip().endswith("ok"), r.stdout
    r = wisp("run", str(wasm), "--input", 'TEXT=["wisp"]')
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)["outputs"][0]
    assert out["name"] == "UPPER" and out["data"] == ["WISP"] and out["shape"] == [1, 1], out


def test_errors_name_the_file_and_the_problem(tmp_path):
    r = wisp("new", "Bad Name", "--lang", "rust", "--dir", str(tmp_path))
    assert r.returncode != 0 and "plugin name 'Bad Name'" in r.stderr
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"\0asm not really")
    r = wisp("check", str(junk))
    assert r.returncode != 0 and str(junk) in r.stderr, r.stderr
    r = wisp("build", str(tmp_path))
    assert r.returncode != 0 and "not a plugin project" in r.stderr, r.stderr
    legacy = os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release", "plugin_legacy_v1.wasm")
    r = wisp("run", legacy, "--input", "INPUT=[1,2]")
    assert r.returncode != 0 and "does not describe itself" in r.stderr, r.stderr
