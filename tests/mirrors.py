"""Package mirrors for the stand-in internet (tests/netprobe.py serves its folder): a flat
Debian repository of real ``.deb`` files (``dpkg-deb --build``, indexed by
``dpkg-scanpackages`` from dpkg-dev) and an npm registry (a packument and a tarball per
package), so recipe builds run ``apt-get install`` and ``npm install`` with no internet."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest


def debian_repo(root: Path, package: str, text: str) -> str:
    """A flat repository under ``root/debian`` holding ``package`` 1.0 (architecture all),
    which installs ``/usr/share/<package>/hello.txt`` holding ``text``; its sources.list
    line's tail (``debian ./``, after the server's URL)."""
    for tool in ("dpkg-deb", "dpkg-scanpackages"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is needed to make a Debian repository (apt install dpkg-dev)")
    repo = root / "debian"
    build = root / "deb-build" / package
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: tests <tests@example.invalid>\nDescription: a test package\n")
    (build / "usr" / "share" / package).mkdir(parents=True)
    (build / "usr" / "share" / package / "hello.txt").write_text(text)
    repo.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(build),
                    str(repo / f"{package}_1.0_all.deb")], check=True, capture_output=True)
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
                              cwd=repo, check=True, capture_output=True).stdout
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages))
    sums = "".join(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}\n"
                   for name, data in (("Packages", packages),
                                      ("Packages.gz", (repo / "Packages.gz").read_bytes())))
    (repo / "Release").write_text("Origin: tests\nLabel: tests\nSuite: stable\n"
                                  "Codename: tests\nArchitectures: all amd64 arm64\n"
                                  f"SHA256:\n{sums}")
    return "debian ./"


def npm_package(root: Path, base_url: str, name: str, value: str) -> str:
    """``name`` 1.0.0 on an npm registry under ``root/npm`` (its tarball fetched from
    ``base_url``): ``require(name).value`` is ``value``; the registry's URL."""
    pkg = root / "npm" / name
    (pkg / "-").mkdir(parents=True, exist_ok=True)
    files = {"package/package.json": json.dumps({"name": name, "version": "1.0.0",
                                                 "main": "index.js"}).encode(),
             "package/index.js": f"module.exports = {{ value: {json.dumps(value)} }};\n"
             .encode()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tgz = buf.getvalue()
    (pkg / "-" / f"{name}-1.0.0.tgz").write_bytes(tgz)
    registry = f"{base_url}/npm/"
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    version = {"name": name, "version": "1.0.0", "main": "index.js",
               "dist": {"tarball": f"{registry}{name}/-/{name}-1.0.0.tgz",
                        "shasum": hashlib.sha1(tgz).hexdigest(), "integrity": integrity}}
    (pkg / "index.json").write_text(json.dumps(
        {"name": name, "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}))
    return registry
