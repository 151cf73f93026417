"""The web console's server side (/ui) on the memory backend: the key exchanged for a
session cookie, what the cookie may do (CSRF, WebSocket origin, a sandbox's port), logout
and revocation, tenancy, the operator pages' API and the audit trail."""

from __future__ import annotations

import asyncio
from contextlib import closing

import httpx2 as httpx
import pytest
import websockets
from _gw import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory


def signed_in(gw: Gateway, who: str) -> tuple[httpx.Client, str]:
    """A client holding only a console session (no key header) and its CSRF token."""
    client = httpx.Client(base_url=gw.url, timeout=30)
    reply = client.post("/ui/api/login", json={"key": gw.tokens[who]})
    assert reply.status_code == 200, reply.text
    return client, reply.json()["csrf"]


def test_the_page_and_its_assets_are_served_with_a_strict_policy(gw: Gateway) -> None:
    with httpx.Client(base_url=gw.url) as client:
        page = client.get("/ui/")
        assert page.status_code == 200 and "/ui/assets/app.js" in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        script = client.get("/ui/assets/app.js")
        assert script.status_code == 200 and "xterm" in script.text
        assert client.get("/ui/assets/app.css").status_code == 200


def test_sign_in_sets_an_httponly_strict_cookie_and_the_key_is_not_echoed(gw: Gateway) -> None:
    with httpx.Client(base_url=gw.url) as client:
        bad = client.post("/ui/api/login", json={"key": "abx_wrong"})
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        assert client.get("/ui/api/me").status_code == 401
        good = client.post("/ui/api/login", json={"key": gw.tokens["a"]})
        cookie = good.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert gw.tokens["a"] not in good.text and gw.tokens["a"] not in good.headers["set-cookie"]
        me = client.get("/ui/api/me").json()
        assert me["key"]["name"] == "a" and not me["admin"] and me["csrf"]
        # A page of another origin cannot sign a browser in (login CSRF).
        foreign = client.post("/ui/api/login", json={"key": gw.tokens["a"]},
                              headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403


def test_a_change_needs_the_csrf_token_and_reads_follow_tenancy(gw: Gateway) -> None:
    a, csrf = signed_in(gw, "a")
    b, csrf_b = signed_in(gw, "b")
    with closing(a), closing(b):
        refused = a.post("/v1/sandboxes", json={})
        assert refused.status_code == 403 and "CSRF" in refused.json()["message"]
        wrong = a.post("/v1/sandboxes", json={}, headers={"X-CSRF-Token": csrf_b})
        assert wrong.status_code == 403
        made = a.post("/v1/sandboxes", json={}, headers={"X-CSRF-Token": csrf})
        assert made.status_code == 201, made.text
        sid = made.json()["sandbox_id"]
        try:
            assert sid in {s["sandbox_id"] for s in a.get("/v1/sandboxes").json()}
            assert sid not in {s["sandbox_id"] for s in b.get("/v1/sandboxes").json()}
            assert b.get(f"/v1/sandboxes/{sid}").status_code == 404
            assert b.get(f"/ui/api/sandboxes/{sid}/audit").status_code == 404
            # The trail holds the REST calls made on it.
            a.get(f"/v1/sandboxes/{sid}/files", params={"path": "/workspace"})
            trail = a.get(f"/ui/api/sandboxes/{sid}/audit").json()
            routes = {(e.get("method"), e.get("route"), e.get("via")) for e in trail}
            assert ("GET", "/files", "console") in routes, trail
        finally:
            gw.provider("a").kill(sid, delete_volume=True)


def test_logout_and_revocation_make_a_copied_cookie_useless(gw: Gateway) -> None:
    client, csrf = signed_in(gw, "a")
    stolen = dict(client.cookies)
    with closing(client), httpx.Client(base_url=gw.url, cookies=stolen) as thief:
        assert thief.get("/v1/sandboxes").status_code == 200
        assert client.post("/ui/api/logout", headers={"X-CSRF-Token": csrf}).status_code == 204
        assert thief.get("/v1/sandboxes").status_code == 401
        assert thief.get("/ui/api/me").status_code == 401
    key, token = gw.keys.create("console-revoked")
    gw.tokens["console-revoked"] = token
    client, _ = signed_in(gw, "console-revoked")
    with closing(client):
        assert client.get("/v1/sandboxes").status_code == 200
        gw.keys.revoke(key.id)
        assert client.get("/v1/sandboxes").status_code == 401


def test_operator_pages_are_an_admins_only(gw: Gateway) -> None:
    a, csrf_a = signed_in(gw, "a")
    admin, csrf = signed_in(gw, "admin")
    with closing(a), closing(admin):
        for path in ("/ui/api/keys", "/ui/api/health"):
            assert a.get(path).status_code == 404
        assert a.post("/ui/api/keys", json={"name": "x"},
                      headers={"X-CSRF-Token": csrf_a}).status_code == 404
        health = admin.get("/ui/api/health").json()
        assert health["status"] == "ok" and "sandboxes" in health
        made = admin.post("/ui/api/keys", headers={"X-CSRF-Token": csrf}, json={
            "name": "console-made", "max_sandboxes": 2, "max_commands": 1, "network": "off"})
        assert made.status_code == 201, made.text
        key = made.json()
        assert key["token"].startswith("abx_") and key["max_sandboxes"] == 2
        assert key["network_ceiling"]["mode"] == "off"
        bad = admin.post("/ui/api/keys", headers={"X-CSRF-Token": csrf},
                         json={"name": "console-bad", "network": {"nope": 1}})
        assert bad.status_code == 400 and "unknown field" in bad.json()["message"]
        listed = {k["id"]: k for k in admin.get("/ui/api/keys").json()}
        assert "token" not in listed[key["id"]] and not listed[key["id"]]["revoked"]
        # The new key signs in; revoking it from the console ends that session at once.
        gw.tokens["console-made"] = key["token"]
        fresh, _ = signed_in(gw, "console-made")
        with closing(fresh):
            assert admin.delete(f"/ui/api/keys/{key['id']}",
                                headers={"X-CSRF-Token": csrf}).json()["revoked"]
            assert fresh.get("/ui/api/me").status_code == 401
        assert admin.delete("/ui/api/keys/../x", headers={"X-CSRF-Token": csrf}
                            ).status_code in (400, 404)


def test_a_terminal_socket_opens_with_the_cookie_only_from_this_origin(gw: Gateway) -> None:
    client, _ = signed_in(gw, "a")
    with closing(client):
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    sid = gw.provider("a").create().sandbox_id
    url = gw.url.replace("http", "ws") + f"/v1/sandboxes/{sid}/pty"
    host = gw.url.removeprefix("http://")

    async def attempt(origin: str | None) -> int:
        headers = {"Cookie": cookie, **({"Origin": origin} if origin else {})}
        try:
            async with websockets.connect(url, additional_headers=headers, origin=None):
                return 101
        except websockets.InvalidStatus as exc:
            return exc.response.status_code

    try:
        assert asyncio.run(attempt("http://evil.example")) == 403
        assert asyncio.run(attempt(None)) == 403
        assert asyncio.run(attempt(f"http://{host}")) == 101
    finally:
        gw.provider("a").kill(sid, delete_volume=True)


def test_a_sandbox_port_never_sees_the_session(gw: Gateway) -> None:
    """Its pages run as an opaque origin under the gateway's host: no cookie of ours for
    them to use, no say over it."""
    client, _ = signed_in(gw, "a")
    sid = gw.provider("a").create().sandbox_id
    try:
        with closing(client):
            reply = client.get(f"/v1/sandboxes/{sid}/ports/8000/")
            assert reply.status_code == 401  # the cookie is no key here
            assert reply.headers["content-security-policy"].startswith("sandbox")
            # So do the share links' path-routed previews (/share/TOKEN, /s/SHARE/...).
            for path in ("/s/shr-x/", "/share/tok"):
                csp = client.get(path).headers.get("content-security-policy", "")
                assert csp.startswith("sandbox") and "allow-same-origin" not in csp
    finally:
        gw.provider("a").kill(sid, delete_volume=True)


def test_another_tenant_writes_nothing_into_a_sandboxs_trail(gw: Gateway) -> None:
    """Calls another key makes on a sandbox it may not use (404) are not the sandbox's
    history: recorded, they let any tenant fill a trail with routes of its choosing and
    push the owner's real records out of the 500 shown."""
    a, _ = signed_in(gw, "a")
    sid = gw.provider("a").create().sandbox_id
    try:
        with closing(a), gw.http("b") as b:
            for route in ("/files/forged-by-b", "/exec", "/files/lock"):
                assert b.post(f"/v1/sandboxes/{sid}{route}", json={}).status_code == 404
            trail = a.get(f"/ui/api/sandboxes/{sid}/audit").json()
            assert not [e for e in trail if e.get("status") == 404], trail
    finally:
        gw.provider("a").kill(sid, delete_volume=True)


def test_console_calls_are_counted_by_their_route(gw: Gateway) -> None:
    """The session's identity rides the request's own scope: a copy hid the matched
    route from the metrics middleware, and every console call counted as unmatched."""
    def unmatched(http: httpx.Client) -> float:
        text = http.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith('abx_http_requests_total{method="GET",route="unmatched"'))
    a, _ = signed_in(gw, "a")
    with closing(a), gw.http("admin") as admin:
        before = unmatched(admin)
        for _ in range(3):
            assert a.get("/v1/sandboxes").status_code == 200
        assert unmatched(admin) == before
