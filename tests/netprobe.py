"""Network probes run inside a sandbox, and the servers that stand in for the internet.

Shared by the root tests (test_network*.py) and the rootless battery. The "internet" is
servers on 127.0.0.2 (HTTP) and 127.0.0.3 (HTTPS) of the host, reachable only through the
names ABX_NETWORK_HOSTS gives them and the range ABX_NETWORK_OPEN_RANGES opens; from
inside a sandbox, 127.x is the sandbox's own loopback, so nothing reaches them by number.
"""

from __future__ import annotations

import base64
import datetime
import fcntl
import gzip
import hashlib
import http.server
import json
import os
import socketserver
import ssl
import subprocess
import textwrap
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HTTP_NAME, TLS_NAME = "pypi.test", "tls.test"
HTTP_ADDR, TLS_ADDR = "127.0.0.2", "127.0.0.3"
# A host secrets may go to (tests/runtime/test_secrets.py), and the CA its servers' own
# certificates are signed by, which sandbox proxies trust upstream (written by that test).
SECRET_NAME, SECRET_ADDR = "api.secret.test", "127.0.0.4"
_HERE = hashlib.sha256(__file__.encode()).hexdigest()[:8]  # this checkout's own
UPSTREAM_CA = f"/var/tmp/abx-test-upstream-ca-{os.getuid()}-{_HERE}.pem"
ENV = {"ABX_NETWORK_HOSTS": f"{HTTP_NAME}={HTTP_ADDR},{TLS_NAME}={TLS_ADDR},"
                            f"{SECRET_NAME}={SECRET_ADDR}",
       "ABX_NETWORK_OPEN_RANGES": f"{HTTP_ADDR}/32,{TLS_ADDR}/32,{SECRET_ADDR}/32",
       "ABX_SECRETS_UPSTREAM_CA": UPSTREAM_CA}
# What the stand-in HTTP server serves from its folder (``root`` in what ``internet``
# yields): the wheel index, and the Debian and npm mirrors tests/mirrors.py writes there.
MIRRORED = ("/simple", "/debian", "/npm")
FAST = 1.0  # seconds: a refusal is immediate, never a timeout


def upstream_ca() -> tuple[Any, Any]:
    """The stand-in internet's CA (certificate, private key), made once per checkout:
    UPSTREAM_CA must exist before any networked sandbox starts (its proxy reads it then),
    whichever test runs first on whichever worker."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key_path = Path(UPSTREAM_CA + ".key")
    with open(UPSTREAM_CA + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (key_path.exists() and Path(UPSTREAM_CA).exists()):
            now = datetime.datetime.now(datetime.UTC)
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in internet CA")])
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(key.public_key()).serial_number(1)
                    .not_valid_before(now - datetime.timedelta(hours=1))
                    .not_valid_after(now + datetime.timedelta(days=30))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                   critical=True)
                    .sign(key, hashes.SHA256()))
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
            Path(UPSTREAM_CA).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(Path(UPSTREAM_CA).read_bytes())
    return cert, serialization.load_pem_private_key(key_path.read_bytes(), None)
ECONNREFUSED, EPERM, ENETUNREACH = 111, 1, 101
# Never reachable whatever the policy: private, CGNAT, link-local incl. cloud metadata.
FORBIDDEN = ["10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254"]

# Inside the sandbox: each probe returns [result, seconds]; results are errnos (0: ok),
# addresses, HTTP statuses or error names. urllib is told to ignore the proxy variables
# where a probe is about the transparent path.
_PROBE = textwrap.dedent("""
    import json, socket, ssl, sys, time, urllib.request, urllib.error
    def timed(fn):
        t = time.monotonic()
        try:
            out = fn()
        except urllib.error.HTTPError as e:
            out = [e.code, e.read().decode(errors="replace")[:300]]
        except (OSError, ssl.SSLError) as e:
            r = getattr(e, "reason", None)
            e = r if isinstance(r, OSError) else e
            out = e.errno if isinstance(e.errno, int) else type(e).__name__
            out = "gaierror" if isinstance(e, socket.gaierror) else out
        return [out, round(time.monotonic() - t, 3)]
    def tcp(host, port):
        def go():
            s = socket.create_connection((host, port), timeout=5); s.close(); return 0
        return timed(go)
    def resolve(name):
        return timed(lambda: socket.gethostbyname(name))
    def http(url, host=None, proxy=False):
        opener = urllib.request.build_opener(*([] if proxy else [urllib.request.ProxyHandler({})]))
        req = urllib.request.Request(url, headers={"Host": host} if host else {})
        return timed(lambda: [200, opener.open(req, timeout=5).read().decode()[:300]])
    def tls(addr, port, sni, cafile):
        def go():
            ctx = ssl.create_default_context(cafile=cafile)
            ctx.check_hostname = False
            with socket.create_connection((addr, port), timeout=5) as s:
                with ctx.wrap_socket(s, server_hostname=sni) as t:
                    t.sendall(b"GET / HTTP/1.1\\r\\nHost: " + sni.encode() + b"\\r\\n\\r\\n")
                    return [200, t.recv(300).decode(errors="replace")]
        return timed(go)
    def udp(host, port):
        def go():
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
            u.sendto(b"x" * 20, (host, port)); return 0
        return timed(go)
    calls = json.loads(sys.stdin.readline())
    print(json.dumps([globals()[c[0]](*c[1:]) for c in calls]))
""")


def run(sb: Any, calls: list[list[Any]]) -> list[list[Any]]:
    """Run ``calls`` ([["tcp", host, port], ...]) in ``sb``; one [result, seconds] each."""
    sb.files.write("/tmp/netprobe.py", _PROBE)
    res = sb.commands.run("python3 /tmp/netprobe.py", stdin=json.dumps(calls) + "\n",
                          timeout=120)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


class _Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        root = getattr(self.server, "root", None)
        if root is not None and self.path.startswith(MIRRORED):
            return self._file(root)
        body = f"hello {self.headers.get('Host')}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, root: Path) -> None:
        self.server.fetched.append(self.path)  # type: ignore[attr-defined]
        path = (root / self.path.lstrip("/").split("?")[0]).resolve()
        if path.is_dir():  # an npm packument is a folder's index.json (its tarballs beside)
            path = next((p for p in (path / "index.html", path / "index.json") if p.exists()),
                        path / "index.html")
        if not path.is_relative_to(root) or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", {".html": "text/html", ".json": "application/json"}
                         .get(path.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def internet(tmp: Path, packages: tuple[str, ...] = ("abxdemo",)) -> Iterator[dict[str, Any]]:
    """The stand-in internet: HTTP (also a package index: a wheel for each of ``packages``;
    ``fetched`` lists the paths asked of it) and HTTPS."""
    root = tmp / "index"
    _wheel_index(root, packages)
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={TLS_NAME}", "-keyout", str(key), "-out", str(cert),
                    "-addext", f"subjectAltName=DNS:{TLS_NAME}"],
                   check=True, capture_output=True)
    plain = _Server((HTTP_ADDR, 0), _Hello)
    plain.root = root.resolve()  # type: ignore[attr-defined]
    plain.fetched = []  # type: ignore[attr-defined]
    secure = _Server((TLS_ADDR, 0), _Hello)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    secure.socket = ctx.wrap_socket(secure.socket, server_side=True)
    for srv in (plain, secure):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield {"http_port": plain.server_address[1], "tls_port": secure.server_address[1],
               "cert": cert.read_text(), "fetched": plain.fetched, "root": root}  # type: ignore[attr-defined]
    finally:
        for srv in (plain, secure):
            srv.shutdown()
            srv.server_close()


def _wheel_index(root: Path, packages: tuple[str, ...]) -> None:
    """A PEP 503 index serving, for each name, one pure-python wheel: version 1.0 of a
    module of that name holding ``VALUE = 42``."""
    import base64
    import hashlib
    import zipfile

    for name in packages:
        pkg = root / "simple" / name
        pkg.mkdir(parents=True, exist_ok=True)
        wheel = pkg / f"{name}-1.0-py3-none-any.whl"
        info = f"{name}-1.0.dist-info"
        files = {f"{name}/__init__.py": b"VALUE = 42\n",
                 f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                     .encode(),
                 f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                  b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
        record = ""
        with zipfile.ZipFile(wheel, "w") as zf:
            for member, data in files.items():
                zf.writestr(member, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                record += f"{member},sha256={digest.decode()},{len(data)}\n"
            zf.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
        (pkg / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    (root / "simple" / "index.html").write_text(
        "".join(f'<a href="{name}/">{name}</a>\n' for name in packages))


def host_ipv4s() -> list[str]:
    """The host's own IPv4 addresses but loopback (where a 0.0.0.0 listener answers)."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                         check=True, env={"PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
                         ).stdout
    return [a["local"] for link in json.loads(out) for a in link.get("addr_info", [])
            if a.get("local") and not a["local"].startswith("127.")]


def _ca_and_leaf(tmp: Path) -> tuple[Path, Path, str]:
    """The stand-in internet's CA (its PEM) and a certificate for SECRET_NAME signed by it
    (cert, key files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = upstream_ca()
    ca_name = ca.subject
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SECRET_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SECRET_NAME)]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    cert, keyfile = tmp / "leaf.pem", tmp / "leaf.key"
    cert.write_bytes(leaf.public_bytes(pem))
    keyfile.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, keyfile, ca.public_bytes(pem).decode()


class _Echo(http.server.BaseHTTPRequestHandler):
    """Says back what it was sent (body and an X-Echo header), records it, redirects
    /redirect to tls.test, and answers a WebSocket upgrade on /ws with one text frame
    echoing the Authorization header. Hostile echoes: /gzip compressed whatever was
    asked, /chunked in two chunks split inside the header's value, and a WebSocket that
    asked for permessage-deflate gets its frame compressed."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        seen = {"port": self.server.server_address[1], "path": self.path,
                "headers": dict(self.headers.items())}
        self.server.seen.append(seen)  # type: ignore[attr-defined]
        auth = self.headers.get("Authorization", "")
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("Upgrade", "").lower() == "websocket":
            accept = base64.b64encode(hashlib.sha1(
                self.headers["Sec-WebSocket-Key"].encode() +
                b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()).decode()
            deflate = "permessage-deflate" in self.headers.get("Sec-WebSocket-Extensions", "")
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            if deflate:  # asked for: compressed messages (RFC 7692)
                self.send_header("Sec-WebSocket-Extensions", "permessage-deflate")
            self.end_headers()
            text = f"ws saw {auth}".encode()
            if deflate:
                packer = zlib.compressobj(wbits=-15)
                text = (packer.compress(text) + packer.flush(zlib.Z_SYNC_FLUSH))[:-4]
            self.wfile.write(bytes([0xc1 if deflate else 0x81, len(text)]) + text)
            self.wfile.flush()
            self.close_connection = True
            return
        body = json.dumps(seen).encode()
        if self.path == "/chunked":  # the echo in two chunks, split inside the value
            half = body.index(auth.encode()) + len(auth) // 2
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:half], body[half:], b""):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            return
        self.send_response(200)
        if self.path == "/gzip":  # compressed whatever the request accepts
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("X-Echo", auth)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815 - the stdlib's name; Expect: 100-continue is answered

    def log_message(self, *args: Any) -> None:
        pass


class _EchoServer(http.server.ThreadingHTTPServer):
    daemon_threads = True




@contextmanager
def secret_hosts(tmp: Path, count: int = 1, *, redirect_to: str = ""
                 ) -> Iterator[tuple[list[int], list[dict[str, Any]], str]]:
    """``count`` HTTPS echo servers of SECRET_NAME on SECRET_ADDR (a certificate from the
    CA sandbox proxies trust upstream): their ports, what they were sent (path, headers)
    and that CA's PEM."""
    cert, key, ca_pem = _ca_and_leaf(tmp)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    seen: list[dict[str, Any]] = []
    servers = []
    for _ in range(count):
        srv = _EchoServer((SECRET_ADDR, 0), _Echo)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        srv.seen = seen  # type: ignore[attr-defined]
        srv.redirect_to = redirect_to  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    try:
        yield [s.server_address[1] for s in servers], seen, ca_pem
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()
