"""The `FROM scratch` image (deploy/Containerfile.scratch), as `./dev image` builds it: what it
holds, how it starts, and that it serves a mounted repository as uid 10001, answers health
checks and an inference, and stops cleanly on SIGTERM. Run by `./dev image` (the static build
takes minutes, so not by CI); `WISP_IMAGE` names the image, `WISP_PODMAN_RUN` any extra
`podman run` arguments this machine needs."""
import json
import os
import shlex
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = os.environ.get("WISP_IMAGE", "localhost/wisp:edge")
RUN_ARGS = shlex.split(os.environ.get("WISP_PODMAN_RUN", ""))


def podman(*args, timeout=120, check=True):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          check=check)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_image_holds_the_binary_and_nothing_to_run_but_it(tmp_path):
    cfg = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    c = cfg["Config"]
    assert c["User"] == "10001:10001", c
    assert c["Entrypoint"] == ["/usr/local/bin/wisp"], c
    assert c["Cmd"] == ["serve", "--model-repository=/models"], c
    assert "XDG_CACHE_HOME=/var/cache" in c["Env"], c
    # The filesystem: the binary, the cache and repository directories, nothing else (no
    # shell, no libc); uid 10001 owns the cache alone.
    cid = podman("create", IMAGE).stdout.strip()
    try:
        podman("export", "-o", str(tmp_path / "fs.tar"), cid)
    finally:
        podman("rm", cid)
    with tarfile.open(tmp_path / "fs.tar") as t:
        members = {m.name.lstrip("./").rstrip("/"): m for m in t.getmembers()}
        head = t.extractfile(members["usr/local/bin/wisp"]).read(1 << 20)
    files = sorted(n for n, m in members.items() if m.isfile())
    # podman adds these empty mount points to every container
    files = [f for f in files if f not in ("etc/hostname", "etc/hosts", "etc/resolv.conf",
                                            "run/.containerenv")]
    assert files == ["usr/local/bin/wisp"], files
    wisp = members["usr/local/bin/wisp"]
    assert wisp.mode & 0o777 == 0o755
    cache = members["var/cache/wisp"]
    assert (cache.uid, cache.gid) == (10001, 10001), (cache.uid, cache.gid)
    for parent in ("var", "var/cache", "models", "usr/local/bin"):
        assert (members[parent].uid, members[parent].mode & 0o777) == (0, 0o755), parent
    dirs = sorted(n for n, m in members.items() if m.isdir())
    assert set(dirs) <= {"", ".", "var", "var/cache", "var/cache/wisp", "models", "usr",
                         "usr/local", "usr/local/bin", "etc", "run", "dev", "proc", "sys"}, dirs
    # Static: no program interpreter, so no libc or loader is needed in the image.
    assert head[:4] == b"\x7fELF" and b"ld-linux" not in head and b"ld-musl" not in head


def test_it_serves_a_mounted_repository_as_10001_and_stops_on_sigterm(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "repo", "add_sub"), repo / "add_sub")
    os.chmod(tmp_path, 0o755)
    http, grpc, metrics = free_port(), free_port(), free_port()
    name = f"wisp-image-test-{os.getpid()}"
    run = podman("run", "-d", "--name", name, "--network", "host", *RUN_ARGS,
                 "-v", f"{repo}:/models:ro", IMAGE,
                 "serve", "--model-repository=/models", "--http-address", "127.0.0.1",
                 "--http-port", str(http), "--grpc-address", "127.0.0.1", "--grpc-port",
                 str(grpc), "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics),
                 check=False)
    assert run.returncode == 0, run.stderr
    started = time.time()
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready",
                                            timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            state = json.loads(podman("inspect", name).stdout)[0]["State"]
            assert state["Running"] and time.time() < deadline, \
                podman("logs", name, check=False).stderr
            time.sleep(0.2)
        ready = time.time() - started
        pid = json.loads(podman("inspect", name).stdout)[0]["State"]["Pid"]
        with open(f"/proc/{pid}/status") as f:
            uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        assert set(uids) == {"10001"}, uids
        body = json.dumps({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
        ]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/add_sub/infer",
                                     data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            out = {o["name"]: o["data"] for o in json.loads(r.read())["outputs"]}
        assert out["OUTPUT0"] == [3.0] * 16 and out["OUTPUT1"] == [1.0] * 16, out
        with open(f"/proc/{pid}/status") as f:
            rss = next(line for line in f if line.startswith("VmRSS:")).split()[1]
        t = time.time()
        podman("stop", "--time", "20", name, timeout=60)  # SIGTERM, then SIGKILL after 20 s
        stopped = time.time() - t
        state = json.loads(podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0 and stopped < 15, (state, stopped)
        print(f"\nimage {IMAGE}: ready {ready:.2f} s after `podman run -d` returned, "
              f"RSS {int(rss) / 1024:.1f} MiB after an inference, stopped in {stopped:.2f} s")
    finally:
        podman("rm", "-f", name, check=False)
