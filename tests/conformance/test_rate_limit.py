"""Triton's rate limiter from the command line: `--rate-limit execution_count` with
`--rate-limit-resource`, instance groups asking for resources, a group that could never run
refused with the reason, and bad flags refused at start-up. (Its scheduling is tested in
wisp-scheduler; its effect under load is `./dev bench ratelimit`.)"""
import os
import shutil
import subprocess

import numpy as np
import tritonclient.http as httpclient

from conftest import ROOT, start_wisp, stop_wisp, wisp_command

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub")


def limited(repo, name, count, instances=2):
    d = os.path.join(repo, name)
    shutil.copytree(FIXTURE, d)
    with open(os.path.join(d, "config.pbtxt")) as f:
        text = f.read().replace('name: "add_sub"', f'name: "{name}"')
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(text + f"""
instance_group [ {{ count: {instances} kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "CORE" count: {count} }} ] priority: 2 }} }} ]
""")


def test_limited_models_serve_and_one_that_could_never_run_is_refused(tmp_path):
    limited(str(tmp_path), "add_sub", 1)
    limited(str(tmp_path), "greedy", 2)
    proc, log, urls = start_wisp(tmp_path, "tract", "conformance-rate-limit.log",
                                 ["--strict-readiness=false", "--rate-limit", "execution_count",
                                  "--rate-limit-resource", "CORE:1"])
    try:
        c = httpclient.InferenceServerClient(url=urls["url"])
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        inputs = [httpclient.InferInput(n, [2, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        for _ in range(20):
            np.testing.assert_allclose(c.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)
        assert not c.is_model_ready("greedy")
        row = [r for r in c.get_model_repository_index() if r["name"] == "greedy"][0]
        assert "asks for 2 of resource 'CORE', but --rate-limit-resource provides 1" in row["reason"]
    finally:
        stop_wisp(proc, log)


def test_bad_rate_limit_flags_stop_the_server_at_start(tmp_path):
    for flags, why in [
        (["--rate-limit", "everything"], "expected 'off' or 'execution_count'"),
        (["--rate-limit", "execution_count", "--rate-limit-resource", "CORE"],
         "expected <name>:<count>[:<device>]"),
        (["--rate-limit", "execution_count", "--rate-limit-resource", "CORE:-1"],
         "the count must be an integer"),
    ]:
        r = subprocess.run([*wisp_command(), "serve", "--model-repository", str(tmp_path),
                            "--http-port", "0", *flags], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert why in r.stderr, r.stderr
