"""The code endpoints over plain HTTP: NDJSON events, error statuses, tenancy, quota,
OpenAPI and /metrics."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator

import pytest
from _gw import Gateway

from agent_sandbox.remote import RemoteProvider

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def code_sb(gw: Gateway, code_template: str) -> Iterator[str]:
    """A code-interpreter sandbox owned by key A."""
    provider = gw.provider("a")
    sid = provider.create(template=code_template).sandbox_id
    yield sid
    provider.kill(sid, delete_volume=True)


def test_streamed_events_in_order(gw: Gateway, code_sb: str) -> None:
    code = ("import matplotlib.pyplot as plt\nprint('before')\nplt.plot([1, 2])\nplt.show()\n"
            "print('after')\n1/0")
    with gw.http("a") as http, http.stream("POST", f"/v1/sandboxes/{code_sb}/code",
                                           json={"code": code, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    kinds = [next(iter(e)) for e in events]
    assert kinds == ["stdout", "result", "stdout", "execution"], events
    assert events[0]["stdout"] == "before\n" and events[2]["stdout"] == "after\n"
    png = base64.b64decode(events[1]["result"]["png"])
    assert png.startswith(PNG_SIGNATURE) and events[1]["result"]["is_main_result"] is False
    summary = events[-1]["execution"]
    assert summary["results"] == []  # sent as events already
    assert summary["stdout"] == "before\nafter\n"
    assert summary["error"]["name"] == "ZeroDivisionError"
    assert "1/0" in summary["error"]["traceback"]


def test_one_json_execution(gw: Gateway, code_sb: str) -> None:
    with gw.http("a") as http:
        r = http.post(f"/v1/sandboxes/{code_sb}/code",
                      json={"code": "from IPython.display import JSON, display\n"
                                    "display(JSON({'a': 1}))\n6 * 7"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["error"] is None and body["context_id"] == "default"
    assert body["results"][0]["json"] == {"a": 1}
    assert body["results"][1] == {**body["results"][1], "text": "42", "is_main_result": True}


def test_contexts(gw: Gateway, code_sb: str) -> None:
    url = f"/v1/sandboxes/{code_sb}/code"
    with gw.http("a") as http:
        r = http.post(url + "/contexts", json={"cwd": "/tmp"})
        assert r.status_code == 201, r.text
        ctx = r.json()
        assert ctx["cwd"] == "/tmp" and ctx["id"].startswith("ctx-")
        assert http.post(url, json={"code": "v = 1", "context": ctx["id"]}).status_code == 200
        ids = {c["id"] for c in http.get(url + "/contexts").json()}
        assert ctx["id"] in ids
        r = http.post(url + f"/contexts/{ctx['id']}/restart")
        assert r.status_code == 204
        r = http.post(url, json={"code": "v", "context": ctx["id"]})
        assert r.json()["error"]["name"] == "NameError"
        assert ctx["user"] is None  # root, as before
        r = http.post(url + "/contexts", json={"user": "user"})
        assert r.status_code == 201 and r.json()["user"] == "user", r.text
        r = http.post(url, json={"code": "import os; os.getuid()", "context": r.json()["id"]})
        assert r.json()["results"][0]["text"] == "1000", r.text


def test_error_statuses(gw: Gateway, code_sb: str, sandbox_a: str) -> None:
    url = f"/v1/sandboxes/{code_sb}/code"
    with gw.http("a") as http:
        cases = [
            (http.post(url, json={}), 400, "invalid_argument", "code"),
            (http.post(url, json={"code": "1", "bogus": True}), 400, "invalid_argument",
             "bogus"),
            (http.post(url, json={"code": "1", "timeout": "soon"}), 400,
             "invalid_argument", "timeout"),
            (http.post(url, json={"code": "1", "timeout": 0}), 400, "invalid_argument",
             "timeout must be greater than 0"),
            (http.post(url, json={"code": "1", "language": "java"}), 400, "invalid_argument",
             "not supported"),
            # Found before the stream begins: a status, not an event.
            (http.post(url, json={"code": "1", "context": "ctx-0", "stream": True}), 404,
             "not_found", "ctx-0"),
            (http.post(url, json={"code": "1", "context": "Bad!", "stream": True}), 400,
             "invalid_argument", "invalid code context id"),
            (http.post(url + "/contexts/ctx-0/restart"), 404, "not_found", "ctx-0"),
            (http.post(url + "/contexts", json={"cwd": "rel"}), 400, "invalid_argument",
             "relative"),
            (http.post(url + "/contexts", json={"user": "no-one"}), 404, "not_found",
             "no user 'no-one'"),
            (http.post(url + "/contexts", json={"user": "a b"}), 400, "invalid_argument",
             "user"),
            (http.post(f"/v1/sandboxes/{sandbox_a}/code", json={"code": "1"}), 409,
             "wrong_state", "code-interpreter-v1"),
            (http.get(f"/v1/sandboxes/{sandbox_a}/code/contexts"), 200, None, ""),
        ]
    with gw.http("b") as http:  # another tenant: not found, never forbidden
        cases += [(http.post(url, json={"code": "1"}), 404, "not_found", ""),
                  (http.get(url + "/contexts"), 404, "not_found", ""),
                  (http.post(url + "/contexts", json={}), 404, "not_found", "")]
    for response, status, code, fragment in cases:
        assert response.status_code == status, (response.request.url, response.text)
        if code is not None:
            body = response.json()
            assert set(body) == {"code", "message", "details"}
            assert body["code"] == code and fragment in body["message"], body


def test_a_cell_holds_a_command_slot(gw: Gateway, code_sb: str) -> None:
    _, token = gw.keys.create("one-cell", max_commands=1, max_sandboxes=1)
    # A key of its own with one command slot: a running cell takes it. The cell says it
    # started, then waits for a file (written through the files API, which takes no slot).
    mine = RemoteProvider(gw.url, token)
    sid = mine.create(template="code-interpreter-v1").sandbox_id
    started = threading.Event()
    cell = ("import os, time\nprint('started', flush=True)\n"
            "while not os.path.exists('/tmp/release'): time.sleep(0.05)\n'released'")
    outcome: list[str | None] = []
    try:
        long = threading.Thread(target=lambda: outcome.append(
            mine.run_code(sid, cell, timeout=120, on_stdout=lambda _: started.set()).text))
        long.start()
        assert started.wait(60), "the cell never started"
        with gw.http() as http:
            refused = http.post(f"/v1/sandboxes/{sid}/code", json={"code": "2"},
                                headers={"Authorization": f"Bearer {token}"})
        mine.write_file(sid, "/tmp/release", b"")
        long.join(60)
        assert outcome == ["'released'"]
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert refused.json()["details"]["quota"] == "max_commands"
        assert mine.run_code(sid, "3").text == "3"  # the slot is free again
    finally:
        mine.kill(sid, delete_volume=True)


def test_openapi_and_metrics(gw: Gateway, code_sb: str) -> None:
    with gw.http() as http:
        spec = http.get("/openapi.json").json()
    for path in ("/v1/sandboxes/{sandbox_id}/code", "/v1/sandboxes/{sandbox_id}/code/contexts",
                 "/v1/sandboxes/{sandbox_id}/code/contexts/{context_id}/restart"):
        assert path in spec["paths"], path
    run = spec["paths"]["/v1/sandboxes/{sandbox_id}/code"]["post"]
    content = run["responses"]["200"]["content"]
    assert "application/x-ndjson" in content and "application/json" in content
    assert {"Execution", "Result", "RunCode", "CodeContext"} <= set(spec["components"]["schemas"])
    gw.provider("a").run_code(code_sb, "1")
    with gw.http("admin") as http:
        text = http.get("/metrics").text
    ok = [line for line in text.splitlines()
          if line.startswith('abx_code_runs_total{outcome="ok"}')]
    assert ok and int(ok[0].split()[-1]) >= 1
    assert 'abx_code_runs_total{outcome="error"}' in text
