"""Property-based requests from the gateway's own /openapi.json (schemathesis strategies,
valid and invalid), half of them aimed at a real sandbox: none may get a 5xx answer."""

from __future__ import annotations

import time
from typing import Any

import schemathesis
from _gw import Gateway
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

BUDGET_SECONDS = 45
# Aimed at a random id only: they would end the sandbox the rest of the run explores.
_DESTRUCTIVE = {("DELETE", "/v1/sandboxes/{sandbox_id}"),
                ("POST", "/v1/sandboxes/{sandbox_id}/reset-rootfs")}


def _tame(case: Any) -> None:
    """Keep generated commands from running for minutes: the point is the API, not sleep."""
    if isinstance(case.body, dict):
        if "cmd" in case.body or case.path.endswith("/wait"):
            case.body["timeout"] = 2
        if case.path == "/v1/sandboxes":
            case.body.pop("network", None)  # slirp4netns per example is slow, not new


def test_generated_requests_get_no_server_error(gw: Gateway) -> None:
    admin = gw.provider("admin")
    before = {s.sandbox_id for s in admin.list()}
    target = admin.create().sandbox_id
    with gw.http() as http:
        spec = http.get("/openapi.json").json()
    operations = [result.ok() for result in
                  schemathesis.openapi.from_dict(spec).get_all_operations()]
    strategies = [op.as_strategy(generation_mode=mode) for op in operations
                  for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    headers = {"Authorization": f"Bearer {gw.tokens['admin']}"}
    deadline = time.monotonic() + BUDGET_SECONDS
    failures: list[str] = []
    calls = 0

    @settings(max_examples=600, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def probe(data: st.DataObject) -> None:
        nonlocal calls
        if time.monotonic() > deadline:
            return
        case = data.draw(st.sampled_from(strategies).flatmap(lambda s: s))
        if "sandbox_id" in (case.path_parameters or {}) and \
                (case.method, case.path) not in _DESTRUCTIVE and data.draw(st.booleans()):
            case.path_parameters["sandbox_id"] = target
        _tame(case)
        response = case.call(base_url=gw.url, headers=headers, timeout=60)
        calls += 1
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path} query={case.query!r} "
                            f"body={case.body!r} -> {response.status_code} "
                            f"{response.text[:300]}")

    try:
        probe()
    finally:
        for info in admin.list():
            if info.sandbox_id not in before:
                admin.kill(info.sandbox_id, delete_volume=True)
    assert calls > 100, f"only {calls} requests in {BUDGET_SECONDS}s"
    assert not failures, "\n".join(failures[:10])

