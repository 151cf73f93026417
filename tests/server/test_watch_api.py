"""GET /v1/sandboxes/{id}/files/watch: Server-Sent Events, tenancy, clean-up when the
client goes, and a gateway that stays small while a sandbox floods a slow client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from _gw import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory
WAIT = 10.0


def _sse(lines: object) -> list[tuple[str, object]]:
    """(event, data) of each SSE message in ``lines`` (comments skipped)."""
    out, name, data = [], "message", []
    for line in lines:  # type: ignore[attr-defined]
        if not line:
            if data:
                out.append((name, json.loads("\n".join(data))))
            name, data = "message", []
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    return out


def test_the_stream_is_server_sent_events(gw: Gateway, sandbox_a: str) -> None:
    url = f"/v1/sandboxes/{sandbox_a}/files/watch"
    with gw.http("a") as http, http.stream("GET", url, params={
            "path": "/workspace", "recursive": "true", "timeout": 3}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == "event: ready"
        assert json.loads(next(lines)[6:]) == {"backend": "inotify"}
        gw.provider("a").run(sandbox_a, "mkdir /workspace/d && touch /workspace/d/f")
        messages = _sse(lines)
    assert ("message", {"type": "create", "path": "/workspace/d", "name": "d",
                        "is_dir": True, "message": ""}) in messages
    assert any(m[1].get("name") == "d/f" for m in messages)  # type: ignore[union-attr]
    assert messages[-1] == ("end", {"reason": "timeout"})


def test_errors_come_as_statuses_before_any_stream(gw: Gateway, sandbox_a: str) -> None:
    url = f"/v1/sandboxes/{sandbox_a}/files/watch"
    with gw.http("a") as http:
        cases = [
            (http.get(url, params={"path": "workspace"}), 400, "relative"),
            (http.get(url, params={"path": "/workspace/none"}), 404, "no such file"),
            (http.get(url, params={"path": "/etc/hostname"}), 400, "not a directory"),
            (http.get(url, params={"path": "/workspace", "timeout": 0}), 400,
             "timeout must be greater than 0"),
            (http.get(url), 400, "path"),
        ]
    for response, status, fragment in cases:
        assert response.status_code == status, response.text
        assert fragment in response.json()["message"]
    with gw.http("b") as http:  # someone else's sandbox: exactly like a missing one
        theirs = http.get(url, params={"path": "/workspace", "timeout": 1})
    assert theirs.status_code == 404 and theirs.json()["code"] == "not_found"


def test_a_client_that_goes_frees_its_watch(gw: Gateway, sandbox_a: str) -> None:
    """16 watches fill the sandbox (the guest's bound, a 429); once their clients hang up,
    16 more fit: the gateway stopped the guest's watches and gave back its slots."""
    url = f"/v1/sandboxes/{sandbox_a}/files/watch"
    params = {"path": "/workspace"}
    with gw.http("a") as http:
        for _ in range(2):
            with ExitStack() as open_ones:
                readers = []  # an iter_lines() dropped would close its connection
                for _ in range(16):
                    r = open_ones.enter_context(http.stream("GET", url, params=params))
                    assert r.status_code == 200
                    readers.append(r.iter_lines())
                    assert next(readers[-1]) == "event: ready"
                refused = http.get(url, params=params)
                assert refused.status_code == 429 and "watched already" in refused.text
            deadline = time.monotonic() + WAIT  # the guest sees each close at once
            while http.get(url, params={**params, "timeout": 0.1}).status_code == 429:
                assert time.monotonic() < deadline, "the watches were not released"
                time.sleep(0.1)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def test_a_flood_to_a_slow_client_keeps_the_gateway_small(gw: Gateway,
                                                          sandbox_a: str) -> None:
    """The client reads nothing while the sandbox makes 60,000 files: the gateway holds
    a bounded queue, drops the rest and says so; afterwards events flow again."""
    assert gw.proc.proc is not None
    pid = gw.proc.proc.pid
    url = f"{gw.url}/v1/sandboxes/{sandbox_a}/files/watch"
    headers = {"Authorization": f"Bearer {gw.tokens['a']}"}
    provider = gw.provider("a")
    with httpx.Client(timeout=60, headers=headers) as http, \
            http.stream("GET", url, params={"path": "/workspace",
                                            "recursive": "true"}) as r:
        lines = r.iter_lines()
        assert next(_messages(lines))[0] == "ready"
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS from here on
        base_kb = _status_kb(pid, "VmRSS")
        flood = provider.run(sandbox_a, "mkdir /workspace/flood && cd /workspace/flood "
                             "&& seq 1 60000 | xargs touch", timeout=300)  # 65k inodes
        assert flood.exit_code == 0, flood.stderr
        seen = overflows = 0
        marked = threading.Event()

        def mark() -> None:  # a change made once the flood is over: one of them arrives
            for i in range(60):
                if marked.wait(1):
                    return
                provider.run(sandbox_a, f"touch /workspace/marker-{i}")

        deadline = time.monotonic() + 120
        for name, data in _messages(lines):
            assert time.monotonic() < deadline, f"{seen} events, {overflows} overflows"
            seen += 1
            if name == "message" and data["type"] == "overflow":
                overflows += 1
                if overflows == 1:
                    threading.Thread(target=mark, daemon=True).start()
            if name == "message" and data["name"].startswith("marker-"):
                marked.set()
                break
        growth_mb = (_status_kb(pid, "VmHWM") - base_kb) / 1024
    assert overflows and seen < 2 * 60_000
    assert growth_mb < 64, f"gateway grew {growth_mb:.0f} MiB"


def _messages(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name, data = "message", ""
    for line in lines:
        if not line:
            if data:
                yield name, json.loads(data)
            name, data = "message", ""
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
