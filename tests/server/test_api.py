"""The HTTP surface itself: error shapes, NDJSON streams, OpenAPI, /metrics, /health."""

from __future__ import annotations

import json
import re

import pytest
from _gw import Gateway

pytestmark = pytest.mark.integration


def test_error_shape_and_statuses(gw: Gateway, sandbox_a: str) -> None:
    with gw.http("a") as http:
        cases = [
            (http.post("/v1/sandboxes", content=b"{not json",
                       headers={"Content-Type": "application/json"}), 400,
             "invalid_argument", "JSON"),
            (http.post("/v1/sandboxes", json={"memory_mb": "lots"}), 400,
             "invalid_argument", "memory_mb"),
            (http.post("/v1/sandboxes", json={"bogus": 1}), 400, "invalid_argument", "bogus"),
            (http.post("/v1/sandboxes", json={"memory_mb": -1}), 400, "invalid_argument",
             "memory_mb must be greater than 0"),
            (http.get("/v1/sandboxes/sbx-../etc"), 404, "not_found", ""),
            (http.get("/v1/sandboxes/not-an-id"), 400, "invalid_argument",
             "invalid sandbox id"),
            (http.get("/v1/sandboxes/sbx-0000000000"), 404, "not_found", "not found"),
            (http.get("/v1/nowhere"), 404, "not_found", ""),
            (http.delete("/v1/templates"), 405, "invalid_argument", ""),
            (http.get(f"/v1/sandboxes/{sandbox_a}/files/content",
                      params={"path": "/workspace/missing"}), 404, "not_found", ""),
            (http.get(f"/v1/sandboxes/{sandbox_a}/files", params={"path": "rel"}), 400,
             "invalid_argument", "relative"),
            (http.get(f"/v1/sandboxes/{sandbox_a}/files/stat"), 400, "invalid_argument",
             "path"),
            (http.post(f"/v1/sandboxes/{sandbox_a}/processes/1/wait",
                       json={"timeout": 5.4e16}), 400, "invalid_argument",
             "timeout must be at most"),
            (http.put(f"/v1/sandboxes/{sandbox_a}/files/content", params={"path": "/dev/zero"},
                      content=b"x"), 400, "invalid_argument", "character device"),
            (http.get(f"/v1/sandboxes/{sandbox_a}/files/content", params={"path": "/dev/tty"}),
             400, "invalid_argument", "/dev/tty"),
        ]
    for response, status, code, fragment in cases:
        body = response.json()
        assert response.status_code == status, (response.request.url, body)
        assert set(body) == {"code", "message", "details"}
        assert body["code"] == code and fragment in body["message"], body


def test_run_streams_ndjson_events(gw: Gateway, sandbox_a: str) -> None:
    with gw.http("a") as http, http.stream(
            "POST", f"/v1/sandboxes/{sandbox_a}/commands",
            json={"cmd": "echo out; echo err >&2; exit 4", "stream": True}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert {"stdout": "out\n"} in events and {"stderr": "err\n"} in events
    assert events[-1]["result"]["exit_code"] == 4
    with gw.http("a") as http:
        r = http.post(f"/v1/sandboxes/{sandbox_a}/commands",
                      json={"cmd": "ls", "cwd": "/nope", "stream": True})
    assert r.status_code == 200  # the stream had begun: the error is its last event
    assert json.loads(r.text.splitlines()[-1])["error"]["code"] == "not_found"


def test_binary_stdin_and_upload_download(gw: Gateway, sandbox_a: str) -> None:
    provider = gw.provider("a")
    blob = bytes(range(256)) * 10
    assert provider.run(sandbox_a, "wc -c", stdin=blob).stdout.strip() == str(len(blob))
    assert provider.write_file(sandbox_a, "/workspace/b.bin", iter([blob, blob])) == 2 * len(blob)
    assert b"".join(provider.read_file(sandbox_a, "/workspace/b.bin", offset=10, limit=5)) \
        == blob[10:15]


def test_openapi_document(gw: Gateway) -> None:
    with gw.http() as http:
        spec = http.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/commands",
                 "/v1/sandboxes/{sandbox_id}/files/content", "/v1/templates", "/metrics"):
        assert path in spec["paths"]


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-z_]+="[^"\\]*",?)*\})? '
                     r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|Inf|NaN))$")


def _samples(text: str) -> dict[str, float]:
    """Prometheus text format, checked line by line: every sample is well formed and
    belongs to a family declared (HELP and TYPE) before it. Returns {series: value}."""
    declared: dict[str, set[str]] = {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            kind, family = line.split()[1:3]
            declared.setdefault(family, set()).add(kind)
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name = match.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in declared else name
        assert declared.get(family) == {"HELP", "TYPE"}, f"undeclared family: {line!r}"
        samples[name + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_metrics_for_admin_only(gw: Gateway, sandbox_a: str) -> None:
    provider = gw.provider("a")
    provider.run(sandbox_a, "true")
    paused = provider.create().sandbox_id
    provider.pause(paused)
    try:
        with gw.http("admin") as http:
            r = http.get("/metrics")
    finally:
        provider.kill(paused, delete_volume=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = _samples(r.text)
    assert samples['abx_sandboxes{state="running"}'] >= 1
    assert samples['abx_sandboxes{state="paused"}'] >= 1
    route = 'method="POST",route="/v1/sandboxes/{sandbox_id}/commands"'
    ran = sum(v for k, v in samples.items()
              if k.startswith(f"abx_http_requests_total{{{route},status="))
    assert samples[f'abx_http_requests_total{{{route},status="200"}}'] >= 1
    # The latency histogram counts the same requests: cumulative buckets ending at +Inf.
    buckets = [v for k, v in samples.items()
               if k.startswith(f"abx_http_request_duration_seconds_bucket{{{route},")]
    assert buckets == sorted(buckets) and len(buckets) > 1
    assert buckets[-1] == samples[f"abx_http_request_duration_seconds_count{{{route}}}"] == ran
    assert samples[f"abx_http_request_duration_seconds_sum{{{route}}}"] > 0
    assert samples["abx_host_disk_free_bytes"] > 0
    assert samples["abx_host_disk_reserve_bytes"] == 2048 << 20
    with gw.http("a") as http:
        assert http.get("/metrics").status_code == 404
    with gw.http() as http:
        assert http.get("/metrics").status_code == 401


def test_metrics_labels_stay_bounded(gw: Gateway) -> None:
    """Clients choose the method they send: invented ones share one label value (or, with
    uvicorn's httptools parser, are refused with 400 before they reach the app)."""
    with gw.http("admin") as http:
        lines = len(http.get("/metrics").text.splitlines())  # earlier tests' series too
    with gw.http() as http:
        codes = {http.request(f"X{i:04d}", "/v1/sandboxes").status_code for i in range(200)}
    with gw.http("admin") as http:
        text = http.get("/metrics").text
    assert "X0001" not in text
    assert 'method="other"' in text or codes == {400}, codes
    assert len(text.splitlines()) - lines < 50, len(text.splitlines()) - lines
