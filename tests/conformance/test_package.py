"""The Debian package (scripts/make_deb.py, `./dev deb`): its files, their modes and owners, its
control data and conffiles, and its systemd unit checked by `systemd-analyze verify`."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

BINARY = os.environ.get("WISP_BIN", os.path.join(ROOT, "target", "debug", "wisp"))


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    if not shutil.which("dpkg-deb"):
        pytest.fail("dpkg-deb is missing (Debian's dpkg package)")
    out = tmp_path_factory.mktemp("deb")
    path = subprocess.check_output(
        [sys.executable, os.path.join(ROOT, "scripts", "make_deb.py"), "--binary", BINARY,
         "--arch", "amd64", "--out", str(out), "--compress", "none"], text=True).strip()
    return path


def listing(deb):
    """{path: (mode string, owner)} of the package's data."""
    rows = {}
    for line in subprocess.check_output(["dpkg-deb", "-c", deb], text=True).splitlines():
        mode, owner, _size, _date, _time, path = line.split(None, 5)
        rows[path.removeprefix(".").rstrip("/") or "/"] = (mode, owner)
    return rows


def test_files_modes_and_owners(deb):
    files = listing(deb)
    expect = {
        "/usr/bin/wisp": "-rwxr-xr-x",
        "/lib/systemd/system/wisp.service": "-rw-r--r--",
        "/etc/default/wisp": "-rw-r--r--",
        "/var/lib/wisp/models": "drwxr-xr-x",
        "/usr/share/doc/wisp/README.Debian": "-rw-r--r--",
    }
    for path, mode in expect.items():
        assert path in files, f"{path} missing from {sorted(files)}"
        assert files[path][0] == mode, (path, files[path])
    assert all(owner == "root/root" for _, owner in files.values())
    unexpected = [p for p, (m, _) in files.items() if not m.startswith("d") and p not in expect]
    assert not unexpected, unexpected


def test_control_and_conffiles(deb):
    field = lambda name: subprocess.check_output(["dpkg-deb", "-f", deb, name], text=True).strip()
    assert field("Package") == "wisp"
    assert field("Architecture") == "amd64"
    assert re.fullmatch(r"\d+\.\d+\.\d+", field("Version"))
    assert "systemd" in field("Depends")
    info = subprocess.check_output(["dpkg-deb", "-I", deb], text=True)
    for script in ["postinst", "prerm", "postrm", "conffiles"]:
        assert script in info
    ctrl = subprocess.check_output(["dpkg-deb", "--ctrl-tarfile", deb])
    assert b"/etc/default/wisp" in ctrl, "the defaults file is a conffile"


def test_the_binary_runs(deb, tmp_path):
    subprocess.check_call(["dpkg-deb", "-x", deb, str(tmp_path)])
    out = subprocess.run([str(tmp_path / "usr/bin/wisp"), "--version"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "wisp" in out.stdout, out


def test_unit_file_is_valid_and_hardened(deb, tmp_path):
    subprocess.check_call(["dpkg-deb", "-x", deb, str(tmp_path)])
    unit = (tmp_path / "lib/systemd/system/wisp.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines()
        if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify"
    assert int(settings["WatchdogSec"]) > 0
    assert settings["DynamicUser"] == "yes"
    assert settings["ProtectSystem"] == "strict"
    assert settings["ReadOnlyPaths"] == "/var/lib/wisp/models"
    assert settings["MemoryMax"]
    assert "--model-repository /var/lib/wisp/models" in settings["ExecStart"]
    # Rolled-back versions are remembered across restarts, outside the repository's directory.
    assert "--state-dir ${STATE_DIRECTORY}" in settings["ExecStart"]
    assert settings["StateDirectory"] and not "/var/lib/wisp/models".startswith(
        "/var/lib/" + settings["StateDirectory"] + "/")
    assert settings["EnvironmentFile"] == "-/etc/default/wisp"
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing (Debian's systemd package)")
    # Point ExecStart at the extracted binary: verify checks that it is executable.
    local = tmp_path / "wisp.service"
    local.write_text(unit.replace("/usr/bin/wisp", str(tmp_path / "usr/bin/wisp")))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no",
                        str(local)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
