#!/usr/bin/env python3
"""Builds Wisp's Debian package from a built `wisp` binary, with dpkg-deb (no cargo-deb needed):

    make_deb.py --binary target/release/wisp --arch amd64 --out target/deb [--compress xz|gzip|none]

Contents:
- /usr/bin/wisp (0755, stripped copy when `strip` for the binary's machine is available);
- /lib/systemd/system/wisp.service (0644): Type=notify, WatchdogSec, systemd's sandboxing;
- /etc/default/wisp (0644, a conffile): the extra `wisp serve` flags;
- /var/lib/wisp/models/ (0755): the model repository the service serves (read-only to it);
- /usr/share/doc/wisp/README.Debian.
The maintainer scripts reload systemd and enable the unit, without starting it (the repository
is empty until the operator fills it).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN = os.path.join(ROOT, "host", "server", "debian")
ARCHES = {"amd64", "arm64", "riscv64"}
STRIP = {
    "amd64": "strip",
    "arm64": "aarch64-linux-gnu-strip",
    "riscv64": "riscv64-linux-gnu-strip",
}

POSTINST = """#!/bin/sh
set -e
if [ "$1" = "configure" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
    systemctl enable wisp.service >/dev/null || true
fi
"""

PRERM = """#!/bin/sh
set -e
if [ "$1" = "remove" ] && [ -d /run/systemd/system ]; then
    systemctl stop wisp.service >/dev/null || true
    systemctl disable wisp.service >/dev/null || true
fi
"""

POSTRM = """#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null || true
fi
"""

README = """Wisp for Debian
===============

The service serves the model repository in /var/lib/wisp/models (Triton's layout: one
directory per model with config.pbtxt and numbered versions). Put models there, then:

    systemctl start wisp
    curl -s localhost:8000/v2/health/ready -w '%{http_code}\\n'

Flags live in /etc/default/wisp (WISP_ARGS). The unit runs as a dynamic user with a read-only
system and repository, caches compiled plugins in /var/cache/wisp, and keeps versions rolled
back for breaching their SLA out of service, across restarts, in /var/lib/wisp-state. systemd
restarts Wisp when its watchdog stops: Wisp pings only while it serves and no model instance is stuck.
"""


def version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    return m.group(1) if m else "0.0.0"


def write(path, text, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def build(binary, arch, out, compress):
    if arch not in ARCHES:
        sys.exit(f"make_deb: --arch is one of {sorted(ARCHES)}, not {arch}")
    ver = version()
    with tempfile.TemporaryDirectory() as stage:
        os.chmod(stage, 0o755)
        bin_path = os.path.join(stage, "usr", "bin", "wisp")
        os.makedirs(os.path.dirname(bin_path))
        shutil.copyfile(binary, bin_path)
        os.chmod(bin_path, 0o755)
        strip = shutil.which(STRIP[arch])
        if strip:
            subprocess.check_call([strip, "--strip-unneeded", bin_path])
        with open(os.path.join(DEBIAN, "wisp.service")) as f:
            write(os.path.join(stage, "lib", "systemd", "system", "wisp.service"), f.read(), 0o644)
        with open(os.path.join(DEBIAN, "wisp.default")) as f:
            write(os.path.join(stage, "etc", "default", "wisp"), f.read(), 0o644)
        models = os.path.join(stage, "var", "lib", "wisp", "models")
        os.makedirs(models)
        for d in [models, os.path.dirname(models)]:
            os.chmod(d, 0o755)
        write(os.path.join(stage, "usr", "share", "doc", "wisp", "README.Debian"), README, 0o644)
        for root, dirs, _ in os.walk(stage):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        size_kb = sum(
            os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(stage) for f in fs
        ) // 1024
        control = (
            f"Package: wisp\n"
            f"Version: {ver}\n"
            f"Architecture: {arch}\n"
            f"Maintainer: Wisp developers <wisp@localhost>\n"
            f"Installed-Size: {size_kb}\n"
            f"Depends: libc6, systemd\n"
            f"Section: net\n"
            f"Priority: optional\n"
            f"Description: inference server speaking the KServe v2 / Triton protocol\n"
            f" One binary serving ONNX models (tract, or ONNX Runtime when installed), sandboxed\n"
            f" WebAssembly plugins and ensembles over HTTP and gRPC, as a systemd service with\n"
            f" readiness notification and a watchdog.\n"
        )
        write(os.path.join(stage, "DEBIAN", "control"), control, 0o644)
        write(os.path.join(stage, "DEBIAN", "conffiles"), "/etc/default/wisp\n", 0o644)
        for name, text in [("postinst", POSTINST), ("prerm", PRERM), ("postrm", POSTRM)]:
            write(os.path.join(stage, "DEBIAN", name), text, 0o755)
        os.makedirs(out, exist_ok=True)
        deb = os.path.join(out, f"wisp_{ver}_{arch}.deb")
        subprocess.check_call(
            ["dpkg-deb", "--root-owner-group", f"-Z{compress}", "--build", stage, deb],
            stdout=subprocess.DEVNULL,
        )
    print(deb)
    return deb


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--arch", default="amd64")
    p.add_argument("--out", default=os.path.join(ROOT, "target", "deb"))
    p.add_argument("--compress", default="xz", choices=["xz", "gzip", "none"])
    a = p.parse_args()
    build(a.binary, a.arch, a.out, a.compress)


if __name__ == "__main__":
    main()
