"""`--model-repository s3://bucket/prefix` against a real S3-protocol server on loopback (moto's
standalone server, spoken to over HTTP with SigV4 by both Wisp and boto3): load, a new version
found by polling, a deleted version, a partial upload that never replaces the serving version,
and wrong credentials or a missing bucket failing start-up with the bucket named."""
import json
import os
import subprocess
import time

import boto3
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, free_port, start_wisp, stop_wisp, wisp_command

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub")
CREDS = {"AWS_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """The S3 server, checking SigV4 signatures against its IAM users: the first three requests
    (which create the user, its key and its policy) are the only unauthenticated ones."""
    import moto.settings
    from moto.server import ThreadedMotoServer
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 3
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="setup",
                       aws_secret_access_key="setup", region_name="us-east-1")
    iam.create_user(UserName="wisp")
    key = iam.create_access_key(UserName="wisp")["AccessKey"]
    iam.put_user_policy(UserName="wisp", PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    CREDS["AWS_ACCESS_KEY_ID"] = key["AccessKeyId"]
    CREDS["AWS_SECRET_ACCESS_KEY"] = key["SecretAccessKey"]
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"], region_name="us-east-1")
    client.create_bucket(Bucket="models")
    yield endpoint, client
    server.stop()


def upload_dir(client, local, key_prefix):
    for root, _, files in os.walk(local):
        for f in files:
            if f == "expected.json":
                continue
            path = os.path.join(root, f)
            key = key_prefix + "/" + os.path.relpath(path, local)
            client.upload_file(path, "models", key)


def env_for(endpoint, tmp_path, **extra):
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.update(extra)
    return env


def infer(url):
    c = httpclient.InferenceServerClient(url=url)
    ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
           httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(np.full((1, 16), 3, np.float32))
    ins[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    r = c.infer("add_sub", ins)
    assert np.array_equal(r.as_numpy("OUTPUT0"), np.full((1, 16), 4, np.float32))
    return r.get_response()["model_version"]


def index(url):
    c = httpclient.InferenceServerClient(url=url)
    return {(m["name"], m.get("version"), m.get("state")) for m in c.get_model_repository_index()}


def wait_for(check, seconds=30):
    deadline = time.time() + seconds
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def test_serves_polls_and_survives_bad_uploads(s3, tmp_path, monkeypatch):
    endpoint, client = s3
    upload_dir(client, FIXTURE, "repo1/add_sub")
    for k, v in env_for(endpoint, tmp_path).items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp("s3://models/repo1", "tract", "conformance-s3.log",
                                 ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    try:
        assert infer(urls["url"]) == "1"

        # A new version, uploaded whole: found by polling, loaded beside, swapped in.
        upload_dir(client, os.path.join(FIXTURE, "1"), "repo1/add_sub/2")
        wait_for(lambda: infer(urls["url"]) == "2")

        # A partial upload (version 3's config says two outputs, its model file is missing):
        # version 3 fails its own load, version 2 keeps serving.
        client.put_object(Bucket="models", Key="repo1/add_sub/3/README", Body=b"uploading")
        time.sleep(3)
        assert infer(urls["url"]) == "2"

        # Version 3 and 2 deleted: the policy's latest is version 1 again.
        for key in ("repo1/add_sub/3/README", "repo1/add_sub/2/model.onnx"):
            client.delete_object(Bucket="models", Key=key)
        wait_for(lambda: infer(urls["url"]) == "1")
    finally:
        stop_wisp(proc, log)


@pytest.mark.parametrize("case", ["wrong credentials", "missing bucket"])
def test_start_up_fails_naming_the_bucket(s3, tmp_path, case):
    endpoint, client = s3
    bucket = "models" if case == "wrong credentials" else "no-such-bucket"
    extra = {"AWS_SECRET_ACCESS_KEY": "not-the-secret"} if case == "wrong credentials" else {}
    out = subprocess.run(
        [*wisp_command(), "serve", "--model-repository", f"s3://{bucket}/repo1",
         "--http-port", str(free_port()), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        env=env_for(endpoint, tmp_path, **extra), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"bucket '{bucket}'" in out.stderr, out.stderr[-2000:]
