"""Every command and code block in README.md and docs/ runs here, or names the test that runs it.

The blocks are read from the Markdown itself, so a changed command is the one tested:
- `sh` blocks of `curl` commands run against `wisp serve` on the bundled `model_repo/` (with
  `localhost:8000` pointed at it); a `# …` comment after a command (or at its end) is what it
  prints: every quoted string in it must appear in the output, and a bare number must be it;
- Python client blocks run against the same server;
- the README's first plugin in each language is built from the block's text with `wisp plugin`
  and run, and a block of `wisp plugin` commands runs as it is, in an empty directory, with
  only the `wisp` binary on PATH;
- every other block is listed in COVERED with the tests that run the same thing (each must exist), and the
  inventory test fails on a block that is in neither list (so a new snippet needs one)."""
import os
import re
import shutil
import subprocess
import sys
import json

import pytest

from conftest import ROOT, start_wisp, stop_wisp

WISP = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))

# Blocks run elsewhere: (file, the block's first line) → the tests that run the same thing, each
# `path::name` (a Rust `fn` or a Python `def` in that file; test_covered_blocks_name_tests_that_exist
# checks that it is there), with a word on what they share.
COVERED = {
    ("README.md", "./dev serve     # builds Wisp and serves model_repo/ on :8000"): (
        ["tests/conformance/test_plugin_cli.py::alone",
         "tests/conformance/test_plugin_cli.py::test_version_names_the_commit_and_what_this_build_runs"],
        ".ci/run (./dev test) itself; ./dev serve runs the same build and `wisp serve` on model_repo; "
        "./dev install and wisp --version are what the `alone` fixture and the version test run"),
    ("README.md", "wisp plugin new shout --lang rust     # or python, js: a project with a test, wit/, wisp-sdk/"): (
        ["tests/conformance/test_plugin_cli.py::test_new_build_check_run_serve_from_the_binary_alone"],
        "new, build, run, serve per language"),
    ("docs/operations.md", "wisp serve --model-repository /models \\"): (
        ["tests/it/hardening.rs::restricted_api_groups_need_their_header_over_http_and_grpc"],
        "restricted API groups and their keys, both protocols"),
    ("docs/operations.md", "wisp keygen --out release            # release.key (secret, mode 0600) and release.pub"): (
        ["tests/it/hardening.rs::signed_models_load_and_a_tampered_reload_keeps_the_old_version"],
        "wisp keygen / sign, then --model-verify-key --require-signed-models"),
    ("docs/operations.md", "wisp serve --model-repository models \\"): (
        ["tests/conformance/test_tls.py::test_https_infer",
         "tests/conformance/test_tls.py::test_grpc_mutual_tls_infer"],
        "both protocols' TLS and mutual TLS flags, with tritonclient"),
    ("docs/plugins.md", "curl -N localhost:8000/v2/models/vad_stream/generate_stream -d '{\"AUDIO\": [0.0, 0.1, ...]}'"): (
        ["tests/conformance/test_decoupled.py::test_vad_stream_streams_a_recordings_frames_in_order"],
        "the elided audio is a recording"),
    ("docs/plugins.md", "use wisp_core::Tensor;"): (
        ["tests/it/embed.rs::infers_in_process_with_the_servers_validation_and_statistics"],
        "and the compiled (no_run) rustdoc example of wisp_service::embed"),
    ("docs/plugins.md", "import numpy as np"): (
        ["tests/conformance/test_inprocess.py::test_same_answers_as_over_http"],
        "import wisp: infer, models, metadata; `./dev test package` runs this block as written "
        "after `pip install ./host/python` in a fresh venv"),
    ("docs/serving.md", "wisp serve --model-repository model_repo \\"): (
        ["tests/conformance/test_trace_otel.py::test_an_http_request_is_exported_under_the_clients_span"],
        "these --trace-config flags, against a collector"),
}


def blocks():
    """(file, line, language, text) of every fenced block."""
    found = []
    for f in DOCS:
        lines = open(os.path.join(ROOT, f)).read().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w*)", lines[i])
            if m:
                j = i + 1
                while not lines[j].startswith("```"):
                    j += 1
                found.append((f, i + 1, m.group(1), "\n".join(lines[i + 1:j])))
                i = j
            i += 1
    return found


def kind(block):
    f, _, lang, text = block
    first = text.split("\n")[0]
    if (f, first) in COVERED:
        return "covered"
    if lang == "sh" and all(c.startswith("curl ") for c, _ in commands(text)):
        return "curl"
    if lang == "sh" and all(c.startswith("wisp plugin ") for c, _ in commands(text)):
        return "plugin-cli"
    if lang == "python" and ("tritonclient" in text or "import openai" in text):
        return "client"
    if f == "README.md" and lang in ("rust", "python", "js") and "UPPER" in text:
        return "plugin"
    return None


def split_comment(command):
    """`command` and its trailing `# comment` (outside quotes), or None."""
    quote = None
    for i, c in enumerate(command):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and i > 0 and command[i - 1].isspace():
            return command[:i].rstrip(), command[i + 1:].strip()
    return command, None


def commands(text):
    """Each shell command of a block (continuation lines and quoted newlines joined) with what
    its comment says it prints (or None)."""
    out, current = [], []
    for line in text.split("\n"):
        if not current and line.startswith("#"):
            if out:
                cmd, exp = out[-1]
                out[-1] = (cmd, (exp + "\n" if exp else "") + line.lstrip("# "))
            continue
        current.append(line)
        joined = "\n".join(current)
        if joined.count("'") % 2 == 0 and not line.endswith("\\"):
            out.append(split_comment(joined))
            current = []
    return out


def test_covered_blocks_name_tests_that_exist():
    """Each test COVERED names is defined in the file it names, so a renamed or moved test
    cannot leave a block pointing at nothing."""
    missing = []
    for block, (tests, _why) in COVERED.items():
        assert tests, f"{block}: names no test"
        for ref in tests:
            path, _, name = ref.partition("::")
            full = os.path.join(ROOT, path)
            text = open(full).read() if os.path.isfile(full) else ""
            if not re.search(rf"^\s*(?:async fn|fn|def) {re.escape(name)}\b", text, re.M):
                missing.append(ref)
    assert not missing, f"COVERED names tests that do not exist: {missing}"


def test_every_block_is_run_here_or_names_the_test_that_runs_it():
    found = blocks()
    unplaced = [(f, line, t.split("\n")[0]) for (f, line, lang, t) in found if kind((f, line, lang, t)) is None]
    assert not unplaced, f"blocks neither run nor covered (add them to test_docs.py): {unplaced}"
    firsts = {(f, t.split("\n")[0]) for (f, _, _, t) in found}
    stale = [k for k in COVERED if k not in firsts]
    assert not stale, f"COVERED names blocks the docs no longer have: {stale}"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    repo = os.path.join(ROOT, "model_repo")
    proc, log, urls = start_wisp(repo, "onnxruntime", "docs.log", ready_within=180)
    yield urls
    stop_wisp(proc, log)


def on(urls, text):
    return (text.replace("localhost:8000", urls["url"])
            .replace("localhost:8001", urls["grpc_url"]))


def matches(expected, output):
    """A printed comment's quoted strings all appear in `output` (numbers such as a creation
    time or an embedding's values vary); a bare number is the whole output."""
    if re.fullmatch(r"\d+", expected.strip()):
        return output.strip() == expected.strip()
    quoted = re.findall(r'"((?:[^"\\]|\\.)*)"', expected)
    return all(f'"{q}"' in output for q in quoted)


CURL = [b for b in blocks() if kind(b) == "curl"]


@pytest.mark.parametrize("block", CURL, ids=[f"{f}:{line}" for f, line, _, _ in CURL])
def test_curl_blocks(demo, block):
    f, line, _, text = block
    for cmd, expected in commands(text):
        r = subprocess.run(["bash", "-o", "pipefail", "-c", on(demo, cmd)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{f}:{line}: {cmd}\n{r.stderr}"
        if expected is not None:
            assert matches(expected, r.stdout), f"{f}:{line}: {cmd}\nexpected {expected}\ngot {r.stdout}"


CLIENTS = [b for b in blocks() if kind(b) == "client"]

# What a block leaves to its reader, defined before it runs.
PREAMBLE = {"import openai": 'texts = ["Hello world", "Wisp serves models."]\n'}


@pytest.mark.parametrize("block", CLIENTS, ids=[f"{f}:{line}" for f, line, _, _ in CLIENTS])
def test_client_blocks(demo, block):
    f, line, _, text = block
    pre = PREAMBLE.get(text.split("\n")[0], "")
    r = subprocess.run([sys.executable, "-c", pre + on(demo, text)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{f}:{line}\n{r.stdout}\n{r.stderr}"


PLUGINS = {lang: t for (f, _, lang, t) in blocks() if kind((f, 0, lang, t)) == "plugin"}
SOURCE = {"rust": "src/lib.rs", "python": "model.py", "js": "plugin.js"}
CONFIG = """backend: "wasm"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.mark.parametrize("lang", ["rust", "python", "js"])
def test_readme_first_plugins_build_and_run(tmp_path, lang):
    """The README's ten-line plugin in `lang`, as the source of a `wisp plugin new` project
    (with the config.pbtxt it needs, since it does not describe itself), built and run."""
    assert lang in PLUGINS, f"the README has no {lang} plugin block"
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               CARGO_TARGET_DIR=os.path.join(ROOT, "target", "plugin-cli"))
    env.pop("WISP_ROOT", None)
    shutil.copy(WISP, tmp_path / "wisp")

    def wisp(*args):
        r = subprocess.run([str(tmp_path / "wisp"), "plugin", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"wisp plugin {' '.join(args)}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    wisp("new", "shout", "--lang", lang)
    project = tmp_path / "shout"
    (project / SOURCE[lang]).write_text(PLUGINS[lang] + "\n")
    (project / "config.pbtxt").write_text(CONFIG)
    wisp("build", "shout", "--out", "repo")
    out = json.loads(wisp("run", "repo/shout/1/model.wasm", "--input", 'TEXT=["hello"]'))
    assert out["outputs"][0]["name"] == "UPPER" and out["outputs"][0]["data"] == ["HELLO"], out


CLI = [b for b in blocks() if kind(b) == "plugin-cli"]


@pytest.mark.parametrize("block", CLI, ids=[f"{f}:{line}" for f, line, _, _ in CLI])
def test_plugin_command_blocks(tmp_path, block):
    """Each command in turn in an empty directory; the last one runs a request, whose
    answer the scaffold's plugin upper-cases."""
    f, line, _, text = block
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(WISP, bindir / "wisp")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bindir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               CARGO_TARGET_DIR=os.path.join(ROOT, "target", "plugin-cli"))
    env.pop("WISP_ROOT", None)
    r = None
    for cmd, _ in commands(text):
        r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, f"{f}:{line}: {cmd}\n{r.stdout}\n{r.stderr}"
    assert '"HELLO"' in r.stdout, r.stdout
