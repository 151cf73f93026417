"""Port share links opened in a real headless browser (Debian's Chromium through
Selenium): an app inside a runc sandbox with a page, its assets, a WebSocket and a form
POST works through the link, by path on the gateway and by host (``PORT-SANDBOX.DOMAIN``,
Chromium told to resolve the wildcard name to the gateway); a wrong or revoked token is
refused, another tenant's sandbox is never reachable, the link dies with the sandbox, and
the token never reaches the sandbox."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from _gw import Gateway
from conftest import KEYS
from websockets.exceptions import InvalidStatus

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import NotFoundError, PermissionDeniedError
from agent_sandbox.surfaces.gateway.process import GatewayProcess, free_port
from agent_sandbox.surfaces.http.keys import KeyStore

pytestmark = pytest.mark.integration
DOMAIN = "preview.test"
PORT = 8000

# The app inside: stdlib only. GET / is a page whose script (app.js) and style (app.css)
# are relative assets; the script opens a WebSocket to ws (echoed back by the app) and
# writes the echo into the page; the form POSTs to submit, whose answer shows what the app
# saw (the posted field and its Cookie header: the app's own cookie, never the gateway's).
APP = r'''
import base64, hashlib, http.server, socketserver
PAGE = b"""<!doctype html><html><head><title>preview app</title>
<link rel="stylesheet" href="app.css"></head><body>
<h1 id="title">hello from the sandbox</h1><p id="ws">waiting</p>
<form method="post" action="submit"><input name="field" id="field" value="posted-value">
<button id="send" type="submit">send</button></form>
<script src="app.js"></script></body></html>"""
JS = b"""const here = location.href.replace(/^http/, 'ws').replace(/[^/]*$/, '');
const ws = new WebSocket(here + 'ws');
ws.onopen = () => ws.send('ping over ws');
ws.onmessage = (e) => { document.getElementById('ws').textContent = 'echo: ' + e.data; };"""
CSS = b"#title { color: rgb(1, 2, 3); }"
class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, body, kind, extra=()):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.endswith("/ws") or self.path == "/ws":
            return self.websocket()
        if self.path.startswith("/app.js"):
            return self.reply(JS, "text/javascript")
        if self.path.startswith("/app.css"):
            return self.reply(CSS, "text/css")
        # Its own cookie (kept), and tries at the gateway's cookie, at other previews'
        # hosts and at the gateway's other pages (dropped).
        self.reply(PAGE, "text/html", [("Set-Cookie", "app=1"),
                                       ("Set-Cookie", "abx_share=planted; Path=/"),
                                       ("Set-Cookie", "wide=1; Domain=preview.test"),
                                       ("Set-Cookie", "root=1; Path=/v1")])
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        form = self.rfile.read(n).decode()
        seen = "form=%s cookie=%s path=%s" % (form, self.headers.get("Cookie"), self.path)
        with open("/tmp/seen.txt", "a") as f:
            f.write(seen + "\n")
        self.reply(("<html><body><p id='got'>%s</p></body></html>" % seen).encode(), "text/html")
    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"].encode()
        magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
        accept = base64.b64encode(hashlib.sha1(key + magic).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:  # echoes each (short) message until the client closes
            head = self.rfile.read(2)
            if len(head) < 2 or head[0] & 0x0F == 8:
                break
            size = head[1] & 0x7F
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(size)))
            self.wfile.write(bytes([0x81, len(data)]) + data)
            self.wfile.flush()
        self.close_connection = True
    def log_message(self, *a):
        with open("/tmp/seen.txt", "a") as f:
            f.write("request %s\n" % (a[1] if len(a) > 1 else a))
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
Server(("127.0.0.1", 8000), App).serve_forever()
'''


def _browser_missing() -> str | None:
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        return "Chromium and chromedriver are not installed (bash scripts/setup.sh test)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    """A gateway (embedded runc engine) with host-routed previews on DOMAIN."""
    port = free_port()
    keys_file = Path(tempfile.mkdtemp(prefix="abx-gw-previews-")) / "keys.db"
    store = KeyStore(keys_file)
    tokens = {name: store.create(name, **options)[1] for name, options in KEYS.items()}
    proc = GatewayProcess(port=port, keys_file=str(keys_file), extra_env={
        "ABX_GATEWAY_PREVIEW_URL": f"http://{DOMAIN}:{port}"})
    proc.start()
    try:
        yield Gateway(proc, store, tokens)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser(gw: Gateway) -> Iterator[Any]:
    if why := _browser_missing():
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--host-resolver-rules=MAP *.{DOMAIN} 127.0.0.1",
                f"--user-data-dir={tempfile.mkdtemp(prefix='abx-chromium-')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def app(gw: Gateway) -> Iterator[str]:
    """Key A's sandbox (network off) serving the app on PORT."""
    a = gw.provider("a")
    sb = Sandbox.create(provider=a)
    sandbox_id = sb.sandbox_id
    sb.files.write("/tmp/app.py", APP)
    sb.commands.run("python3 /tmp/app.py", background=True)
    deadline = time.monotonic() + 20
    while sb.commands.run(f"python3 -c \"import socket; socket.create_connection(("
                          f"'127.0.0.1', {PORT}))\"").exit_code != 0:
        assert time.monotonic() < deadline, "the app did not start"
        time.sleep(0.2)
    yield sandbox_id
    try:
        a.kill(sandbox_id, delete_volume=True)
    except NotFoundError:
        pass


def _wait_text(driver: Any, element_id: str, prefix: str, timeout: float = 15) -> str:
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while True:
        try:
            text = driver.find_element(By.ID, element_id).text
        except Exception:  # noqa: BLE001 - not there yet
            text = ""
        if text.startswith(prefix) or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def _use_app(driver: Any, url: str) -> None:
    """Open ``url`` (a share link), then check the page, its assets, its WebSocket, its
    cookie and its form POST."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    assert "/share/" not in driver.current_url  # the token left the address bar
    assert driver.title == "preview app", driver.page_source[:500]
    color = driver.find_element(By.ID, "title").value_of_css_property("color")
    assert color in ("rgba(1, 2, 3, 1)", "rgb(1, 2, 3)"), color  # app.css loaded
    assert _wait_text(driver, "ws", "echo:") == "echo: ping over ws"  # app.js + WebSocket
    ours = [c for c in driver.get_cookies() if c["name"] == "abx_share"]
    assert ours and ours[0]["httpOnly"] and ours[0].get("sameSite") == "Lax", ours
    driver.find_element(By.ID, "send").click()
    got = _wait_text(driver, "got", "form=")
    assert got.startswith("form=field=posted-value cookie=app=1 "), got


def test_a_share_link_works_in_a_browser_by_path_and_by_host(
        gw: Gateway, browser: Any, app: str) -> None:
    a = gw.provider("a")
    share = a.share_port(app, PORT)
    assert share.url.startswith(f"http://{PORT}-{app}.{DOMAIN}:{gw.proc.port}/__abx/share/")
    token = share.url.rsplit("/", 1)[1]
    _use_app(browser, share.url)  # by host: its own origin
    assert browser.current_url == f"http://{PORT}-{app}.{DOMAIN}:{gw.proc.port}/submit"
    _use_app(browser, f"{gw.url}/share/{token}")  # by path on the gateway
    assert browser.current_url == f"{gw.url}/s/{share.share_id}/submit"
    # The token never reached the sandbox: not in a path, not in a cookie.
    seen = a.run(app, "cat /tmp/seen.txt").stdout
    assert "request" in seen and token not in seen and "abx_share" not in seen
    # The list shows the link without its token.
    listed = a.list_port_shares(app)
    assert [s.share_id for s in listed] == [share.share_id] and token not in str(listed)


def test_wrong_revoked_and_foreign_links_are_refused(gw: Gateway, browser: Any,
                                                     app: str) -> None:
    a, b = gw.provider("a"), gw.provider("b")
    with pytest.raises(NotFoundError):  # another tenant cannot share A's sandbox
        b.share_port(app, PORT)
    with pytest.raises(PermissionDeniedError, match="ABX_GATEWAY_PUBLIC_PORTS"):
        a.share_port(app, PORT, public=True)
    share = a.share_port(app, PORT)
    token = share.url.rsplit("/", 1)[1]
    with httpx.Client(base_url=gw.url, follow_redirects=False) as http:
        assert http.get("/share/" + "x" * 43).status_code == 404
        assert http.get(f"/s/{share.share_id}/").status_code == 401  # no cookie
        opened = http.get(f"/share/{token}")
        assert opened.status_code == 303 and "HttpOnly" in opened.headers["set-cookie"]
        assert http.get(f"/s/{share.share_id}/").status_code == 200
        # Another page on the gateway's origin (path) or domain (host) can plant a cookie
        # of the same name beside the link's (script can, though not overwrite it): the
        # link's own still admits, by path and by host.
        planted = {"Cookie": f"abx_share={token}; abx_share=planted-by-another-page"}
        assert http.get(f"/s/{share.share_id}/", headers=planted).status_code == 200
        assert http.get("/", headers={"Host": f"{PORT}-{app}.{DOMAIN}:{gw.proc.port}", **planted}
                        ).status_code == 200
        # A page of another sandbox's preview is of the same site (the preview domain):
        # the browser sends this link's SameSite=Lax cookie along with what it makes the
        # browser ask of this host. Refused, a WebSocket too (no CORS guards one); this
        # host's own pages and its sandbox's other ports are not.
        here = f"{PORT}-{app}.{DOMAIN}:{gw.proc.port}"
        foreign = f"http://{PORT}-sbx-0123456789.{DOMAIN}:{gw.proc.port}"
        mine = {"Host": here, "Cookie": f"abx_share={token}"}
        assert http.post("/submit", headers={**mine, "Origin": foreign}).status_code == 403
        for origin in (f"http://{here}", f"http://3000-{app}.{DOMAIN}:{gw.proc.port}"):
            assert http.get("/", headers={**mine, "Origin": origin}).status_code == 200
        _websocket_by_host(gw, here, mine["Cookie"], f"http://{here}")  # opens
        with pytest.raises(InvalidStatus):
            _websocket_by_host(gw, here, mine["Cookie"], foreign)
        # B's sandbox: A's cookie opens nothing of it, by path or by host.
        other = b.create().sandbox_id
        try:
            b_share = b.share_port(other, PORT)
            assert http.get(f"/s/{b_share.share_id}/").status_code == 401
            by_host = http.get("/", headers={"Host": f"{PORT}-{other}.{DOMAIN}:{gw.proc.port}",
                                             "Cookie": f"abx_share={token}"})
            assert by_host.status_code == 401
        finally:
            b.kill(other, delete_volume=True)
        a.revoke_port_share(app, share.share_id)
        assert http.get(f"/s/{share.share_id}/").status_code == 404
    browser.get(f"{gw.url}/share/{token}")
    assert "not valid" in browser.page_source


def _websocket_by_host(gw: Gateway, host: str, cookie: str, origin: str) -> None:
    """A WebSocket to the app's /ws on preview host ``host``, from a page of ``origin``."""
    import socket

    from websockets.sync.client import connect

    sock = socket.create_connection(("127.0.0.1", gw.proc.port), timeout=30)
    with connect(f"ws://{host}/ws", sock=sock, origin=origin,  # type: ignore[arg-type]
                 additional_headers={"Cookie": cookie}, open_timeout=30) as ws:
        ws.send("hijack?")
        assert ws.recv(timeout=30) == "hijack?"


@contextlib.contextmanager
def _opened(gw: Gateway, token: str) -> Iterator[tuple[Any, Any, dict[str, str], str]]:
    """A keep-alive HTTP connection signed in by the link's token (its cookie header and
    the link's home path) and a WebSocket through the link with that cookie, its echo
    working."""
    import http.client

    from websockets.sync.client import connect

    conn = http.client.HTTPConnection("127.0.0.1", gw.proc.port, timeout=30)
    conn.request("GET", f"/share/{token}")
    opened = conn.getresponse()
    opened.read()
    assert opened.status == 303, opened.status
    cookie = {"Cookie": opened.getheader("Set-Cookie").split(";", 1)[0]}
    home = opened.getheader("Location")
    conn.request("GET", home, headers=cookie)
    page = conn.getresponse()
    assert page.status == 200 and b"preview app" in page.read()
    try:
        with connect(f"ws://127.0.0.1:{gw.proc.port}{home}ws", additional_headers=cookie,
                     open_timeout=30) as ws:
            ws.send("before")
            assert ws.recv(timeout=30) == "before"
            yield conn, ws, cookie, home
    finally:
        conn.close()


def test_revoking_a_link_cuts_what_is_open_through_it(gw: Gateway, app: str) -> None:
    """Revoked: the open WebSocket is closed by the gateway (1008), and the keep-alive
    connection's next request, on the same connection, is refused."""
    from websockets.exceptions import ConnectionClosed

    a = gw.provider("a")
    share = a.share_port(app, PORT)
    with _opened(gw, share.url.rsplit("/", 1)[1]) as (conn, ws, cookie, home):
        sock = conn.sock
        a.revoke_port_share(app, share.share_id)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)  # the gateway's close, not a timeout
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, closed.value
        assert "revoked" in closed.value.rcvd.reason
        conn.request("GET", home, headers=cookie)
        refused = conn.getresponse()
        assert refused.status == 404 and b"not valid" in refused.read()
        assert conn.sock is sock  # the same connection, kept alive: this request refused


def test_an_expired_link_cuts_its_websocket(gw: Gateway, app: str) -> None:
    from websockets.exceptions import ConnectionClosed

    share = gw.provider("a").share_port(app, PORT, expires_in=3)
    with _opened(gw, share.url.rsplit("/", 1)[1]) as (_, ws, _, _), \
            pytest.raises(ConnectionClosed) as closed:
        while True:  # it echoes until the link expires (3 s), then is closed
            ws.send("still here")
            assert ws.recv(timeout=30) == "still here"
            time.sleep(0.5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, closed.value


def test_access_logs_never_hold_a_token() -> None:
    import logging

    from agent_sandbox.surfaces.rest.routes.previews import RedactShareTokens

    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s" %d',
                               ("1.2.3.4:5", "GET", "/__abx/share/Ab_-9?x=1", 303), None)
    RedactShareTokens().filter(record)
    assert record.getMessage() == '1.2.3.4:5 - "GET /__abx/share/<token>?x=1" 303'


def test_a_link_dies_with_its_sandbox(gw: Gateway) -> None:
    a = gw.provider("a")
    sandbox_id = a.create().sandbox_id
    share = a.share_port(sandbox_id, PORT)
    a.kill(sandbox_id, delete_volume=True)
    with httpx.Client(base_url=gw.url, follow_redirects=False) as http:
        assert http.get(f"/share/{share.url.rsplit('/', 1)[1]}").status_code == 404
