"""Package mirrors for the stand-in internet (tests/netprobe.py serves its folder): a flat
Debian repository of real ``.deb`` files (``dpkg-deb --build``, indexed by
``dpkg-scanpackages`` from dpkg-dev) and an npm registry (a packument and a tarball per
package), so recipe builds run ``apt-get install`` and ``npm install`` with no internet;
and an OCI registry (``registry``) serving a busybox image for ``FROM`` an image reference."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import socketserver
import ssl
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def busybox_image(marker: str, padding: int = 0) -> dict[str, bytes]:
    """A one-layer OCI image of a static busybox and ``/etc/marker`` holding ``marker``
    (and ``/padding``, ``padding`` random bytes): its blobs by digest and its manifest
    (under ``"manifest"``)."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.skip("needs a static busybox (apt-get install busybox-static)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("bin", "etc", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "cat", "ls", "echo", "id", "sleep", "test"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        for name, data in (("etc/marker", marker.encode() + b"\n"),
                           *((("padding", os.urandom(padding)),) if padding else ())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    layer = buf.getvalue()
    blob = gzip.compress(layer, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin", "IMAGE_MARKER=" + marker],
                                    "WorkingDir": "/tmp", "Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [_sha(layer)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha(blob), "size": len(blob)}]}).encode()
    return {_sha(config): config, _sha(blob): blob, "manifest": manifest}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Registry(http.server.BaseHTTPRequestHandler):
    """The read half of the OCI distribution API for the images of ``server.images``
    (name: ``busybox_image``), behind HTTP basic auth when ``server.creds`` is set."""

    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self._answer(head=True)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._answer(head=False)

    def _answer(self, *, head: bool) -> None:
        server: Any = self.server
        server.asked.append(self.path)
        if server.creds and self.headers.get("Authorization") != "Basic " + base64.b64encode(
                ":".join(server.creds).encode()).decode():
            return self._send(401, b'{"errors": [{"code": "UNAUTHORIZED"}]}', head,
                              {"WWW-Authenticate": 'Basic realm="tests"'})
        match = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/]+)", self.path)
        if self.path == "/v2/":
            return self._send(200, b"{}", head)
        image = server.images.get(match.group(1)) if match else None
        if match is None or image is None:
            return self._send(404, b'{"errors": [{"code": "NAME_UNKNOWN"}]}', head)
        kind, ref = match.group(2), match.group(3)
        if kind == "manifests" and (ref == "latest" or ref == _sha(image["manifest"])):
            data = image["manifest"]
            return self._send(200, data, head, {
                "Content-Type": "application/vnd.oci.image.manifest.v1+json",
                "Docker-Content-Digest": _sha(data)})
        if kind == "blobs" and ref in image:
            return self._send(200, image[ref], head, {"Docker-Content-Digest": ref})
        return self._send(404, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}', head)

    def _send(self, code: int, body: bytes, head: bool, headers: dict[str, str] | None = None
              ) -> None:
        self.send_response(code)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def registry(address: str, images: dict[str, dict[str, bytes]],
             creds: tuple[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """An OCI registry over HTTPS on ``address`` serving ``images``, its certificate
    trusted the way an operator trusts a registry of their own: in
    ``/etc/containers/certs.d/ADDRESS:PORT/`` (removed afterwards). What it yields holds
    its ``host`` (address:port) and the paths ``asked`` of it."""
    certs = Path("/etc/containers/certs.d")
    try:
        certs.mkdir(parents=True, exist_ok=True)
    except OSError:
        pytest.skip(f"{certs} is not writable: the test registry's certificate goes there")
    server = socketserver.ThreadingTCPServer((address, 0), _Registry)
    server.daemon_threads = True
    server.images, server.creds, server.asked = images, creds, []  # type: ignore[attr-defined]
    host = f"{address}:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "2", "-subj", "/CN=test registry", "-keyout", str(key), "-out",
                        str(cert), "-addext", f"subjectAltName=IP:{address}"],
                       check=True, capture_output=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        trusted = certs / host
        trusted.mkdir(exist_ok=True)
        shutil.copy(cert, trusted / "ca.crt")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {"host": host, "asked": server.asked}  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(trusted, ignore_errors=True)
