"""The HTTP surface itself: error shapes, NDJSON streams, OpenAPI, /metrics, /health."""

from __future__ import annotations

import json
import re
from unittest.mock import ANY

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
            (http.get("/v1/sandboxes", params={"stat": "running"}), 400, "invalid_argument",
             "unknown query parameter 'stat': /v1/sandboxes takes state, template"),
            (http.get("/v1/sandboxes", params=[("template", "base"), ("template", "x")]), 400,
             "invalid_argument", "query parameter 'template' given 2 times: give it once"),
            (http.get("/v1/sandboxes", params={"template": "-1e+188"}), 400,
             "invalid_argument", "template"),
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


def test_reads_at_every_offset_the_api_takes(gw: Gateway, sandbox_a: str) -> None:
    """The issue's request, and the bounds the schema states: a normal answer (nothing
    past the end) or a 400 naming the field, never a 503 from a guest that hung up."""
    gw.provider("a").write_file(sandbox_a, "/0", b"hello")
    url = f"/v1/sandboxes/{sandbox_a}/files/content"
    with gw.http("a") as http:
        for offset, limit, want in ((2**62 - 1, 1, b""), (2**62, 2**62, b""), (1, 2**62, b"ello"),
                                    (2**31, None, b"")):
            params = {"path": "/0", "offset": offset, **({"limit": limit} if limit else {})}
            got = http.get(url, params=params)
            assert (got.status_code, got.content) == (200, want), (params, got.text)
        for params in ({"offset": 2**62 + 1}, {"offset": -1}, {"limit": 2**62 + 1},
                       {"offset": 2**63}):
            got = http.get(url, params={"path": "/0", **params})
            assert got.status_code == 400, (params, got.text)
            assert next(iter(params)) in got.json()["message"], got.text


def test_openapi_document(gw: Gateway) -> None:
    with gw.http() as http:
        spec = http.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/commands",
                 "/v1/sandboxes/{sandbox_id}/files/content", "/v1/templates", "/metrics"):
        assert path in spec["paths"]
    # A bearer scheme, so that /docs has an Authorize button; every /v1 call needs it,
    # /health takes it if given.
    assert spec["components"]["securitySchemes"]["apiKey"] == {
        "type": "http", "scheme": "bearer", "description": ANY}
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1/"):
                assert operation["security"] == [{"apiKey": []}], path
    assert spec["paths"]["/health"]["get"]["security"] == [{"apiKey": []}, {}]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_load_nothing_from_elsewhere(gw: Gateway, page: str) -> None:
    """The pages' scripts and styles come from the gateway itself: they work offline."""
    with gw.http() as http:
        r = http.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assets = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert len(assets) >= 2 and "http" not in r.text.replace("http-equiv", ""), r.text
        for asset in assets:
            assert asset.startswith("/docs/assets/"), asset
            got = http.get(asset)
            assert got.status_code == 200 and len(got.content) > 1000, asset
        assert re.search(r"url: *'/openapi.json'|spec-url=\"/openapi.json\"", r.text), r.text


def test_health_tells_an_anonymous_caller_only_that_it_lives(gw: Gateway,
                                                              sandbox_a: str) -> None:
    with gw.http() as http:
        assert http.get("/health").json() == {"status": "ok"}
        r = http.get("/health", headers={"Authorization": "Bearer abx_nope"})
        assert r.status_code == 401  # a key given must be a live one
    with gw.http("a") as http:
        assert http.get("/health").json() == {"status": "ok", "sandboxes": 1}  # its own
    with gw.http("b") as http:
        assert http.get("/health").json() == {"status": "ok", "sandboxes": 0}
    with gw.http("admin") as http:
        assert http.get("/health").json()["sandboxes"] >= 1


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
    # Each running sandbox's use, from its cgroup and disk (paused ones have no series).
    mine = f'{{sandbox="{sandbox_a}"}}'
    assert 0 < samples[f"abx_sandbox_memory_used_bytes{mine}"] <= \
        samples[f"abx_sandbox_memory_limit_bytes{mine}"]
    assert 0 < samples[f"abx_sandbox_disk_used_bytes{mine}"] <= \
        samples[f"abx_sandbox_disk_size_bytes{mine}"]
    assert 0 <= samples[f"abx_sandbox_cpu_used_percent{mine}"] <= 100
    assert f'abx_sandbox_memory_used_bytes{{sandbox="{paused}"}}' not in samples
    assert samples["abx_sandbox_series_omitted"] == 0
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
