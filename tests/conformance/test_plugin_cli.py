"""`wisp plugin` from the binary alone: `./dev install` puts the built `wisp` into an empty
directory away from the repository, and for each language `new` scaffolds a project that
`build` turns into a repository entry (the Python one built from inside the project, with no
directory named), `check` accepts, `run` executes and `serve` answers over HTTP without a
config.pbtxt (the plugin describes itself). The Rust project builds against the packaged
`wisp-sdk` crate (`cargo package`), which must hold the same files the binary writes."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request

import pytest

from conftest import ROOT, free_port

WISP = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """An empty directory outside the repository holding only a copy of the `wisp` binary."""
    d = tmp_path_factory.mktemp("alone")
    assert not str(d).startswith(ROOT)
    env = dict(os.environ, PATH="/usr/bin:/bin")
    r = subprocess.run(["bash", os.path.join(ROOT, "dev"), "install", "--binary", WISP, str(d)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"installed {d}/wisp" in r.stdout, r.stdout
    assert f'{d} is not on your PATH: export PATH="{d}:$PATH"' in r.stdout, r.stdout
    assert os.access(d / "wisp", os.X_OK) and os.listdir(d) == ["wisp"]
    return d


def test_version_names_the_commit_and_what_this_build_runs(alone):
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    for flag in ("--version", "-V"):
        out = subprocess.run([str(alone / "wisp"), flag], env=dict(env, ORT_DYLIB_PATH=""),
                             capture_output=True, text=True, timeout=60, check=True).stdout
        lines = out.splitlines()
        assert lines[0].startswith("wisp 0.") and "x86_64-unknown-linux-gnu" in lines[0], out
        if commit:  # a checkout (CI's fresh clone is one): the binary was built from HEAD
            assert f"(commit {commit}," in lines[0], out
        assert lines[1].startswith("onnx engines: tract (built in), onnxruntime ("), out
        assert "plugins: wasmtime 48." in out and "default native" in out, out
    # ONNX Runtime found, or said not to be
    lib = os.environ.get("ORT_DYLIB_PATH")
    if lib:
        out = subprocess.run([str(alone / "wisp"), "--version"], env=dict(env, ORT_DYLIB_PATH=lib),
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert f"onnxruntime (found: {lib})" in out, out
    out = subprocess.run([str(alone / "wisp"), "--version"],
                         env=dict(env, ORT_DYLIB_PATH="/nonexistent/libonnxruntime.so"),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "named but missing: /nonexistent/libonnxruntime.so" in out, out


def wisp(alone, *args, cwd=None, env=None, timeout=900):
    base = {k: v for k, v in os.environ.items() if k not in ("WISP_ROOT", "CARGO_TARGET_DIR")}
    base.update(
        # componentize-py is found on PATH (the venv's), as an author's would be
        PATH=f"{VENV_BIN}:{os.environ['PATH']}",
        # a scaffolded Rust plugin builds its dependencies once per test run here
        CARGO_TARGET_DIR=os.path.join(ROOT, "target", "plugin-cli"),
        RUST_BACKTRACE="1",
    )
    base.update(env or {})
    return subprocess.run([str(alone / "wisp"), "plugin", *args], cwd=cwd or alone, env=base,
                          capture_output=True, text=True, timeout=timeout)


def packaged_sdk(dest):
    """`cargo package -p wisp-sdk`, unpacked into `dest`; returns the crate's directory."""
    r = subprocess.run(["cargo", "package", "-p", "wisp-sdk", "--no-verify", "--allow-dirty",
                        "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    crates = [f for f in os.listdir(os.path.join(ROOT, "target", "package"))
              if f.startswith("wisp-sdk-") and f.endswith(".crate")]
    assert len(crates) == 1, crates
    with tarfile.open(os.path.join(ROOT, "target", "package", crates[0])) as t:
        t.extractall(dest, filter="data")
    return dest / crates[0][: -len(".crate")]


def files(d):
    return sorted(os.path.relpath(os.path.join(p, f), d)
                  for p, _, fs in os.walk(d) for f in fs)


def serve_and_infer(alone, repo, name):
    port = free_port()
    log = open(os.path.join(ROOT, "target", f"plugin-cli-{name}.log"), "w")
    proc = subprocess.Popen([str(alone / "wisp"), "serve", "--model-repository", str(repo),
                             "--http-address", "127.0.0.1", "--http-port", str(port),
                             "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
                            cwd=alone, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
                                            timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, f"not ready: see {log.name}"
            time.sleep(0.1)
        body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1],
                                       "data": ["served"]}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{name}/infer",
                                     data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["outputs"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.mark.parametrize("lang", ["rust", "python", "js"])
def test_new_build_check_run_serve_from_the_binary_alone(alone, tmp_path, lang):
    name = f"shout-{lang}"
    work = tmp_path / "work"
    work.mkdir()
    r = wisp(alone, "new", name, "--lang", lang, cwd=work)
    assert r.returncode == 0, r.stderr
    project = work / name
    assert (project / "wit" / "plugin.wit").is_file() and (project / "wisp-sdk").is_dir()
    assert not (project / "config.pbtxt").exists(), "the plugin describes itself"
    if lang == "rust":
        source = (project / "src" / "lib.rs").read_text()
        assert "pub struct ShoutRust;" in source, source
        crate = packaged_sdk(tmp_path / "crate")
        vendored = project / "wisp-sdk"
        for f in files(vendored):
            if f != "Cargo.toml":
                assert (vendored / f).read_bytes() == (crate / f).read_bytes(), f
        assert [f for f in files(crate) if f.startswith(("src", "wit"))] == \
            [f for f in files(vendored) if f.startswith(("src", "wit"))]
        # built against the packaged crate itself, not the vendored copy
        shutil.rmtree(vendored)
        shutil.copytree(crate, vendored)
    if lang == "python":
        t = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
                           cwd=project, capture_output=True, text=True, timeout=120)
        assert t.returncode == 0, t.stdout + t.stderr
    repo = work / "repo"
    if lang == "python":  # from inside the project: the directory defaults to "."
        r = wisp(alone, "build", "--out", str(repo), cwd=project)
    else:
        r = wisp(alone, "build", name, "--out", str(repo), cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    wasm = repo / name / "1" / "model.wasm"
    assert wasm.is_file() and not (repo / name / "config.pbtxt").exists()
    r = wisp(alone, "check", str(wasm))
    assert r.returncode == 0, r.stdout + r.stderr
    world = "0.2.0" if lang == "js" else "0.3.0"
    assert f"world: wisp:plugin@{world}" in r.stdout and r.stdout.strip().endswith("ok"), r.stdout
    assert "describes itself: max_batch_size 8" in r.stdout, r.stdout
    r = wisp(alone, "run", str(wasm), "--input", 'TEXT=["wisp"]')
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)["outputs"][0]
    assert out["name"] == "UPPER" and out["data"] == ["WISP"] and out["shape"] == [1, 1], out
    out = serve_and_infer(alone, repo, name)
    assert out["name"] == "UPPER" and out["data"] == ["SERVED"], out


def test_errors_are_one_line_without_a_backtrace(alone, tmp_path):
    def one_line(r, needle):
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], r.stderr
        assert "backtrace" not in r.stderr.lower(), r.stderr

    one_line(wisp(alone, "new", "Bad Name", "--lang", "rust", "--dir", str(tmp_path)),
             "plugin name 'Bad Name'")
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"\0asm not really")
    one_line(wisp(alone, "check", str(junk)), str(junk))
    one_line(wisp(alone, "build", str(tmp_path)), "not a plugin project")
    legacy = os.path.join(ROOT, "plugins", "target", "wasm32-wasip2", "release", "plugin_legacy_v1.wasm")
    one_line(wisp(alone, "run", legacy, "--input", "INPUT=[1,2]"), "does not describe itself")
    # A missing tool names the command that installs it.
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / "model.py").write_text("class TritonPythonModel: pass\n")
    r = wisp(alone, "build", str(tmp_path / "py"),
             env={"PATH": "/nonexistent", "WISP_TOOLS_DIR": str(tmp_path / "tools")})
    one_line(r, "python3 -m pip install 'componentize-py==0.25.1'")
