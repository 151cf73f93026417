"""Secrets injected at the egress proxy, on a real sandbox: the value reaches the secret's
host (a real TLS server on loopback standing in for the internet, its certificate from a
CA the proxy trusts upstream) and nothing else, and never enters the sandbox. One
sandbox runs the whole hostile battery in one probe (seconds)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netprobe import (
    HTTP_NAME,
    SECRET_ADDR,
    SECRET_NAME,
    TLS_NAME,
    internet,
    secret_hosts,
)

from agent_sandbox import Sandbox, Secret
from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration

VALUE = "ghp_Sup3rSecretValue_0123456789"
KEY_VALUE = "k3y/with spaces&more"
QUOTED_VALUE = 'q"uoted\\back/slash<&>'  # what JSON and HTML escape
INJECT_VALUE = "inj_On3veryRequest_0123"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("secrets")
    with internet(tmp / "internet") as net, secret_hosts(
            tmp, 2, redirect_to=f"https://{TLS_NAME}:{net['tls_port']}/") as (ports, seen,
                                                                                 ca_pem):
        port, other_port = ports  # the secret's port, and another port of the same host
        # This host's engine, through the SDK (its secrets are this user's own).
        for name in ("gh", "key", "tlsbad", "quoted", "inj"):
            if name in {s.name for s in Secret.list()}:
                Secret.delete(name)
        Secret.create("gh", hosts=[f"{SECRET_NAME}:{port}"], env="GH_TOKEN", value=VALUE)
        Secret.create("key", hosts=[f"{SECRET_NAME}:{port}"], query="key", value=KEY_VALUE)
        Secret.create("quoted", hosts=[f"{SECRET_NAME}:{port}"], header="X-Api-Key",
                      value=QUOTED_VALUE)
        Secret.create("inj", hosts=[f"{SECRET_NAME}:{port}"], header="X-Inject-Key",
                      inject=True, value=INJECT_VALUE)
        # A secret host whose real certificate the proxy cannot verify (tls.test is
        # self-signed): its secret is never sent.
        Secret.create("tlsbad", hosts=[f"{TLS_NAME}:{net['tls_port']}"],
                      value="never-sent-value")
        sb = Sandbox.create(network=[SECRET_NAME, TLS_NAME, HTTP_NAME],
                            secrets=["gh", "key", "tlsbad", "quoted", "inj"])
        sb.files.write("/tmp/upstream-ca.pem", ca_pem)
        try:
            yield {"sb": sb, "port": port, "other_port": other_port, "seen": seen, "net": net}
        finally:
            sb.kill(delete_volume=True)


_PROBE = r"""
import base64, http.client, json, os, socket, ssl, sys
def https(host, port, path, headers, cafile=None, tunnel=False):
    try:
        ctx = ssl.create_default_context(cafile=cafile)
        if tunnel:
            c = http.client.HTTPSConnection("10.255.255.1", 3128, context=ctx, timeout=10)
            c.set_tunnel(host, port)
        else:
            c = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        body = r.read()
        if r.getheader("Content-Encoding") == "gzip":
            body = __import__("gzip").decompress(body)
        return [r.status, body.decode(errors="replace"), r.getheader("X-Echo"),
                r.getheader("Location")]
    except Exception as e:
        return [type(e).__name__, str(e)[:300]]
def plain(host, port, path, headers):
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        return [r.status, r.reason[:300]]
    except Exception as e:
        return [type(e).__name__, str(e)[:300]]
def tls(host, port, first, alpn):
    try:
        ctx = ssl.create_default_context()
        ctx.set_alpn_protocols(alpn)
        with socket.create_connection((host, port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname=host) as t:
                t.sendall(first.encode())
                out = b""
                while len(out) < 4096:
                    chunk = t.recv(4096)
                    if not chunk:
                        break
                    out += chunk
                return [t.selected_alpn_protocol(), out.decode(errors="replace")[:600]]
    except Exception as e:
        return [type(e).__name__, str(e)[:300]]
def sni(addr, port, name, first):
    try:
        ctx = ssl._create_unverified_context()
        with socket.create_connection((addr, port), timeout=10) as s:
            with ctx.wrap_socket(s, server_hostname=name) as t:
                t.sendall(first.encode())
                return [t.recv(4096).decode(errors="replace")[:600]]
    except Exception as e:
        return [type(e).__name__, str(e)[:300]]
calls = json.loads(sys.stdin.readline())
print(json.dumps([globals()[c[0]](*c[1:]) for c in calls]))
"""


def test_a_secret_reaches_its_host_and_nothing_else(world: dict[str, Any]) -> None:
    sb, port, other = world["sb"], world["port"], world["other_port"]
    seen: list[dict[str, Any]] = world["seen"]
    tls_port, http_port = world["net"]["tls_port"], world["net"]["http_port"]
    auth = {"Authorization": "Bearer abx-secret:gh"}
    ws_head = (f"GET /ws HTTP/1.1\r\nHost: {SECRET_NAME}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer abx-secret:gh\r\n\r\n")
    calls = [
        ["https", SECRET_NAME, port, "/ok", auth],                           # 0 injected
        ["https", SECRET_NAME, port, "/tunnel", auth, None, True],           # 1 via CONNECT
        ["https", SECRET_NAME, port, "/q?key=abx-secret:key&x=1", {}],       # 2 query
        ["https", SECRET_NAME, port, "/abx-secret:gh", {}],                  # 3 wrong place
        ["https", SECRET_NAME, port, "/k", {"X-Other": "abx-secret:gh"}],    # 4 wrong header
        ["https", SECRET_NAME, other, "/other-port", auth, "/tmp/upstream-ca.pem"],  # 5
        ["https", SECRET_NAME, port, "/redirect", auth],                     # 6
        ["https", TLS_NAME, tls_port, "/", auth],                            # 7 other host
        ["plain", HTTP_NAME, http_port, "/", auth],                          # 8 plain HTTP
        ["tls", SECRET_NAME, port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".decode(),
         ["h2", "http/1.1"]],                                                # 9 HTTP/2
        ["tls", SECRET_NAME, port, ws_head, ["http/1.1"]],                   # 10 WebSocket
        ["https", TLS_NAME, tls_port, "/", {"Authorization": "Bearer abx-secret:tlsbad"}],
    ]
    sb.files.write("/tmp/secret_probe.py", _PROBE)
    res = sb.commands.run("python3 /tmp/secret_probe.py", stdin=json.dumps(calls) + "\n",
                          timeout=120)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    text = json.dumps(out)
    assert VALUE not in text and KEY_VALUE not in text, "a value reached the sandbox"

    ok, tunnel, query, in_path, other_header, other_port, redirect, other_host, plain, h2, ws, \
        bad_tls = out
    # The host got the value; the sandbox saw it blanked out (body and header echo).
    assert ok[0] == 200, ok
    got = [s for s in seen if s["path"] == "/ok"][0]["headers"]
    assert got["Authorization"] == f"Bearer {VALUE}"
    assert got.get("Accept-Encoding") == "identity"
    blank = "*" * len(f"Bearer {VALUE}")  # the header as sent, every character
    assert ok[2] == blank, ok
    assert "*" * len(VALUE) in ok[1], ok
    assert tunnel[0] == 200, tunnel
    assert [s for s in seen if s["path"] == "/tunnel"][0]["headers"]["Authorization"] == \
        f"Bearer {VALUE}"
    assert query[0] == 200, query
    from urllib.parse import quote
    assert [s for s in seen if s["path"].startswith("/q?")][0]["path"] == \
        f"/q?key={quote(KEY_VALUE, safe='')}&x=1"
    # A placeholder anywhere its rule does not put it: refused, naming the rule.
    for refused in (in_path, other_header):
        assert refused[0] == 403, refused
        assert "secret gh goes only to" in refused[1], refused
    # Another port of the same host is not the secret's: passed through, placeholder only.
    assert other_port[0] == 200, other_port
    assert [s for s in seen if s["path"] == "/other-port"][0]["headers"]["Authorization"] == \
        "Bearer abx-secret:gh"
    # A redirect to another host: the client sends the placeholder on, and the proxy, which
    # reads that connection (tls.test is a secret host of another secret), refuses it.
    assert redirect[0] == 302, redirect
    assert other_host[0] == 403 and "secret gh goes only to" in other_host[1], other_host
    assert plain[0] == 403 and "only over HTTPS" in plain[1], plain
    # HTTP/2 is not offered (ALPN http/1.1); its preface is no HTTP/1.1 request: refused.
    assert h2[0] == "http/1.1" and " 403 " in h2[1], h2
    # A WebSocket upgrade goes through with the secret; its echo comes back blanked out.
    assert ws[1].startswith("HTTP/1.1 101"), ws
    assert "ws saw " + blank in ws[1], ws
    # An upstream the proxy cannot verify never gets the secret.
    assert bad_tls[0] == 403 and "could not be verified" in bad_tls[1], bad_tls
    assert not any("never-sent-value" in json.dumps(s) for s in seen)
    assert {s["path"] for s in seen if VALUE in json.dumps(s)} <= {
        "/ok", "/tunnel", "/redirect", "/ws", "/gzip", "/chunked"}


def test_an_echo_the_proxy_could_not_read_never_reaches_the_sandbox(
        world: dict[str, Any]) -> None:
    """A host's echo of the value that blanking could miss: compressed although asked not
    to, split across chunks of a chunked body, in a WebSocket message compressed by an
    extension the sandbox asked for, escaped in JSON."""
    sb, port, seen = world["sb"], world["port"], world["seen"]
    auth = {"Authorization": "Bearer abx-secret:gh"}
    ws_head = (f"GET /ws HTTP/1.1\r\nHost: {SECRET_NAME}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: ZGVmbGF0ZSBtZSBwbGVhc2U=\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n"
               "Authorization: Bearer abx-secret:gh\r\n\r\n")
    calls = [["https", SECRET_NAME, port, "/gzip", auth],
             ["https", SECRET_NAME, port, "/chunked", auth],
             ["tls", SECRET_NAME, port, ws_head, ["http/1.1"]],
             ["https", SECRET_NAME, port, "/escaped", {"X-Api-Key": "abx-secret:quoted"}]]
    sb.files.write("/tmp/secret_probe.py", _PROBE)
    res = sb.commands.run("python3 /tmp/secret_probe.py", stdin=json.dumps(calls) + "\n",
                          timeout=120)
    assert res.exit_code == 0, res.stderr
    compressed, chunked, ws, escaped = json.loads(res.stdout.strip().splitlines()[-1])
    assert VALUE not in json.dumps([compressed, chunked, ws]), "a value reached the sandbox"
    # The echo is JSON: the value's quote, backslash (and, as some encoders do, slash and
    # HTML's characters) escaped.
    assert escaped[0] == 200, escaped
    for form in (QUOTED_VALUE, json.dumps(QUOTED_VALUE)[1:-1],
                 json.dumps(QUOTED_VALUE)[1:-1].replace("/", "\\/")):
        assert form not in escaped[1], escaped
    assert [s for s in seen if s["path"] == "/escaped"][0]["headers"]["X-Api-Key"] == \
        QUOTED_VALUE
    assert compressed[0] == 502 and "gzip" in compressed[1], compressed
    blank = "*" * len(f"Bearer {VALUE}")
    assert chunked[0] == 200 and blank in chunked[1], chunked
    assert ws[1].startswith("HTTP/1.1 101") and "ws saw " + blank in ws[1], ws
    asked = [s for s in seen if s["headers"].get("Sec-WebSocket-Key") ==
             "ZGVmbGF0ZSBtZSBwbGVhc2U="]
    assert asked and "Sec-WebSocket-Extensions" not in asked[0]["headers"], asked


def test_the_value_is_nowhere_in_the_sandbox(world: dict[str, Any]) -> None:
    sb = world["sb"]
    env = sb.commands.run("env").stdout
    assert "GH_TOKEN=abx-secret:gh" in env and "SSL_CERT_FILE=" in env
    # The search's own arguments must not hold what it looks for: given reversed on stdin.
    search = (
        "import glob, os, sys\n"
        "needles = [n[::-1].encode() for n in sys.stdin.read().splitlines() if n]\n"
        "paths = glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline')\n"
        "for top in ('/etc', '/tmp', '/workspace', '/root'):\n"
        "    for d, _, fs in os.walk(top):\n"
        "        paths += [os.path.join(d, f) for f in fs]\n"
        "for p in paths:\n"
        "    try:\n"
        "        data = open(p, 'rb').read(1 << 22)\n"
        "    except OSError:\n"
        "        continue\n"
        "    if any(n in data for n in needles):\n"
        "        print(p)\n")
    sb.files.write("/tmp/search.py", search)
    found = sb.commands.run("python3 /tmp/search.py", timeout=60,
                            stdin=f"{VALUE[::-1]}\nYEK ETAVIRP NIGEB\n")
    assert found.stdout.strip() == "", found.stdout
    # The proxy is outside the sandbox: not among its processes.
    ps = sb.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
    assert "netproxy" not in ps
    # Its CA is trusted in there, and it is only the sandbox's: a name constraint.
    ca = sb.commands.run("tail -c 2000 /etc/abx/ca-certificates.crt").stdout
    assert "BEGIN CERTIFICATE" in ca


def test_secrets_are_never_logged_or_returned(world: dict[str, Any]) -> None:
    engine = local_provider()
    listed = json.dumps([s.model_dump() for s in engine.list_secrets()])
    assert "gh" in listed and VALUE not in listed
    sbdir = engine.backend.sandbox_dir(world["sb"].sandbox_id)
    log = (sbdir / "netproxy.log").read_text()
    assert "refused" in log and VALUE not in log and KEY_VALUE not in log
    store = Path(engine.config.data_dir) / "secrets"
    for path in store.rglob("*.json"):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_smuggling_the_value_elsewhere_is_refused(world: dict[str, Any]) -> None:
    """Requests on a secret host's connection that another reader could take for one to
    another host, or that would carry the placeholder elsewhere: refused before the value
    is put in; an interim answer (100 Continue) is relayed, the final one blanked."""
    sb, port, seen = world["sb"], world["port"], world["seen"]
    auth = "Authorization: Bearer abx-secret:gh\r\n"
    host = f"Host: {SECRET_NAME}\r\n"
    heads = [
        f"GET https://{TLS_NAME}/ HTTP/1.1\r\n{host}{auth}\r\n",        # absolute, other host
        f"GET / HTTP/1.1\r\n{host}Host: {TLS_NAME}\r\n{auth}\r\n",      # two Hosts
        f"GET / HTTP/1.1\r\nHost: {TLS_NAME}\r\n{auth}\r\n",            # Host is not SNI
        f"GET / HTTP/1.1\r\n{host}X-A: b\r\n {auth}\r\n",               # obs-fold
        f"GET / HTTP/1.1\r\n{host}X-A: b\n{auth}\r\n",                   # bare LF
        f"GET / HTTP/1.1\r\n{host}X-A: b\r{auth}\r\n",                   # bare CR
        f"GET / HTTP/1.1\r\n{host}Authorization : Bearer abx-secret:gh\r\n\r\n",
        f"GET / HTTP/1.1\r\n{host}X-Long: {'a' * 20000}\r\n{auth}\r\n",  # oversized
    ]
    expect = (f"POST /continue HTTP/1.1\r\n{host.upper()}{auth}Expect: 100-continue\r\n"
              "Content-Length: 2\r\n\r\nhi")
    calls = [["tls", SECRET_NAME, port, h, ["http/1.1"]] for h in heads]
    # The inject secret (set on every request to its host): on a connection by number
    # with its host's SNI, or to its host's name with another SNI: refused; SNI in upper
    # case with a trailing dot is its host.
    inj = f"GET /inj HTTP/1.1\r\n{host}\r\n"
    calls += [["sni", SECRET_ADDR, port, SECRET_NAME, inj],
              ["sni", SECRET_NAME, port, TLS_NAME, inj],
              ["sni", SECRET_NAME, port, SECRET_NAME.upper() + ".", inj]]
    calls.append(["tls", SECRET_NAME, port, expect, ["http/1.1"]])
    sb.files.write("/tmp/secret_probe.py", _PROBE)
    res = sb.commands.run("python3 /tmp/secret_probe.py", stdin=json.dumps(calls) + "\n",
                          timeout=120)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert VALUE not in json.dumps(out), "a value reached the sandbox"
    *refused, by_number, other_sni, upper, continued = out
    assert INJECT_VALUE not in json.dumps(out), "a value reached the sandbox"
    for refused_tls in (by_number, other_sni):  # refused or reset, never answered
        assert refused_tls[0].endswith("Error"), refused_tls
    assert upper[0].startswith("HTTP/1.1 200"), upper
    assert [s["headers"].get("X-Inject-Key") for s in seen if s["path"] == "/inj"] == \
        [INJECT_VALUE]
    for i, answer in enumerate(refused):
        assert answer[1].startswith("HTTP/1.1 403 Forbidden by sandbox secret rules"), \
            (i, answer)
    assert continued[1].startswith("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"), continued
    assert "*" * len(f"Bearer {VALUE}") in continued[1], continued
    # Only the request that named its host one way got the value.
    assert [s["path"] for s in seen if VALUE in json.dumps(s) and s["path"] in
            ("/", "/continue")] == ["/continue"]
