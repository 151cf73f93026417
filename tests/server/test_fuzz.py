"""Property-based requests from the gateway's own /openapi.json (schemathesis strategies,
valid and invalid), half of them aimed at a real sandbox and a real process. The schema
must say exactly what the gateway accepts and answers: no 5xx; documented statuses,
content types and bodies; a request the schema allows is not refused as malformed
(400/422), and one it forbids is not accepted."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any

import pytest
import schemathesis
from _gw import Gateway
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import AcceptedNegativeData, FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData

from agent_sandbox.core.bounds import MAX_COMMAND_TIMEOUT, MAX_LOCK_WAIT, MAX_PID
from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.core.templates import NAME_PATTERN as TEMPLATE_NAME_PATTERN
from agent_sandbox.core.watch import MAX_WATCH_TIMEOUT
from agent_sandbox.surfaces.rest.schemas import SANDBOX_ID_PATTERN

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory

# ABX_FUZZ_SECONDS=600 for a longer soak.
BUDGET_SECONDS = float(os.environ.get("ABX_FUZZ_SECONDS", "55"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection, positive_data_acceptance]
# Aimed at a random id only: they would end the sandbox the rest of the run explores.
_DESTRUCTIVE = {("DELETE", "/v1/sandboxes/{sandbox_id}"),
                ("POST", "/v1/sandboxes/{sandbox_id}/reset-rootfs")}
_SHORT = 2  # seconds: commands, waits and cells the run makes
# A directory upload's body is a tar stream: generated as any binary body is.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tame(case: Any) -> None:
    """Keep generated commands from running for minutes (the point is the API, not
    sleep) and creates from starting a network helper each. Only values the schema allows
    are changed, and to values it allows: a case stays as valid or as invalid as it was
    generated."""
    query = case.query
    if case.path.endswith("/files/watch") and isinstance(query, dict):
        timeout = query.get("timeout")  # a watch without one lasts as long as its client
        if timeout is None or (_number(timeout) and 0 < timeout <= MAX_WATCH_TIMEOUT):
            query["timeout"] = 0.2
    if case.method == "PUT" and case.path.endswith("/files/content") \
            and isinstance(query, dict):
        wait = query.get("lock_wait")  # a file a generated lock holds: no 3 s waits
        if wait is None or (_number(wait) and 0 <= wait <= MAX_LOCK_WAIT):
            query["lock_wait"] = 0
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path.endswith("/files/lock"):
        wait = body.get("wait")
        if wait is None or (_number(wait) and 0 <= wait <= MAX_LOCK_WAIT):
            body["wait"] = 0
    if case.path.endswith(("/commands", "/wait", "/code")):
        timeout = body.get("timeout")
        if timeout is None or (_number(timeout) and 0 < timeout <= MAX_COMMAND_TIMEOUT):
            body["timeout"] = _SHORT
    if case.path in ("/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/network") and \
            body.get("network") is True:
        body["network"] = False


def _aim(case: Any, data: st.DataObject, target: str, pid: int) -> None:
    """Half the time, at the real sandbox (and a third of those, its real process) and,
    for creates, the real template: only where the generated value was valid already."""
    params = case.path_parameters or {}
    if not data.draw(st.booleans()):
        return
    sandbox_id = params.get("sandbox_id")
    if isinstance(sandbox_id, str) and re.fullmatch(SANDBOX_ID_PATTERN, sandbox_id) and \
            (case.method, case.path) not in _DESTRUCTIVE:
        params["sandbox_id"] = target
    if isinstance(params.get("pid"), int) and 1 <= params["pid"] <= MAX_PID and \
            data.draw(st.integers(0, 2)) == 0:
        params["pid"] = pid
    body = case.body if isinstance(case.body, dict) else {}
    if case.path == "/v1/sandboxes" and isinstance(body.get("template"), str) and \
            re.fullmatch(TEMPLATE_NAME_PATTERN, body["template"]):
        body["template"] = "base"


def _refused_for_what_is_there(case: Any, response: Any) -> bool:
    """A valid file operation the engine refuses, with a 400, for what the path holds: a
    directory read as a file, a file used as a directory, a read-only mount, the root
    itself. Its message starts with that path (no input check's does); no schema can
    say which paths hold what. Likewise a network policy's entries: a string is a host
    name, a wildcard or a CIDR only by netpolicy's grammar."""
    if response.status_code in (412, 423) and "/files" in case.path:
        return True  # the file changed, or another call holds it: its state, not the input
    if response.status_code != 400:
        return False
    message = response.json().get("message", "")
    body = case.body if isinstance(case.body, dict) else {}
    if "network" in body and message.startswith("network "):
        return True  # netpolicy's check of names and CIDRs, which no schema can spell
    if body.get("secrets") and message.startswith("secrets are sent by"):
        return True  # secrets need a network that reaches their hosts: two fields at once
    if case.path == "/v1/secrets" and re.match(r"secret [a-z][a-z0-9_-]*: ", message):
        return True  # a rule's hosts, header, format, env: core/secrets.py's grammar
    if case.path == "/v1/templates" and message.startswith(("recipe line ", "the recipe ")):
        return True  # a Dockerfile's grammar, which no schema can spell either
    if "/files" not in case.path:
        return False
    if message == "refusing to remove '/'":
        return True
    if "src" in body and message.startswith(f"rename {body['src']} -> {body.get('dst')}: "):
        return True
    paths = [p for p in ((case.query or {}).get("path"), body.get("path"))
             if isinstance(p, str)]
    # As given, or as the guest names it: a leading "//" is one "/" to it.
    return any(message.startswith(f"{q}: ") for p in paths for q in {p, "/" + p.lstrip("/")})


def _a_string_on_the_wire(case: Any) -> bool:
    """A query value generated as a one-string list (invalid where a string is asked)
    is sent as that string: the gateway cannot tell it from the valid one."""
    return any((isinstance(v, list) and len(v) == 1 and isinstance(v[0], str))
               or v in ({}, [])  # an empty object or list is no parameter at all on the wire
               for v in (case.query or {}).values())


def _describe(case: Any, response: Any, title: str) -> str:
    mode = case.meta.generation.mode.value if case.meta else "?"
    return (f"{case.method} {case.path} [{mode}] {title}: path={case.path_parameters!r} "
            f"query={case.query!r} body={case.body!r} -> {response.status_code} "
            f"{response.text[:200]!r}")


def test_generated_requests_conform_to_the_schema(gw: Gateway) -> None:
    admin = gw.provider("admin")
    before = {s.sandbox_id for s in admin.list()}
    target = admin.create().sandbox_id
    pid = admin.start(target, "sleep 3600")
    with gw.http() as http:
        spec = http.get("/openapi.json").json()
    operations = [result.ok() for result in
                  schemathesis.openapi.from_dict(spec).get_all_operations()]
    strategies = [op.as_strategy(generation_mode=mode) for op in operations
                  for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    headers = {"Authorization": f"Bearer {gw.tokens['admin']}"}
    deadline = time.monotonic() + BUDGET_SECONDS
    found: dict[tuple[str, str, str], str] = {}  # one example per operation and check
    calls = 0

    # Runs of a hundred examples until the budget is spent: a run cut short would
    # generate differently from the one before, which hypothesis takes for a bug.
    @settings(max_examples=100, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def probe(data: st.DataObject) -> None:
        nonlocal calls
        case = data.draw(st.sampled_from(strategies).flatmap(lambda s: s))
        _aim(case, data, target, pid)
        _tame(case)
        response = case.call(base_url=gw.url, headers=headers, timeout=60)
        calls += 1
        if case.path == "/v1/sandboxes" and response.status_code == 201:
            # quota room; a generated timeout of a second may have ended it already
            with contextlib.suppress(NotFoundError):
                admin.kill(response.json()["sandbox_id"], delete_volume=True)
        if response.status_code == 400 and response.text == "Invalid HTTP request received.":
            return  # a head the HTTP server refused (a generated header no parser takes)
        if response.status_code == 503 and \
                response.json().get("code") == "runtime_unavailable":
            return  # what the memory backend lacks (CRIU, a cgroup): documented, no crash
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:
            for failure in group.exceptions:
                if isinstance(failure, RejectedPositiveData) and \
                        _refused_for_what_is_there(case, response):
                    continue
                if isinstance(failure, AcceptedNegativeData) and _a_string_on_the_wire(case):
                    continue
                found.setdefault((case.method, case.path, failure.title),
                                 _describe(case, response, failure.title))

    try:
        while time.monotonic() < deadline:
            probe()
    finally:
        for info in admin.list():
            if info.sandbox_id not in before:
                admin.kill(info.sandbox_id, delete_volume=True)
    assert calls > 500, f"only {calls} requests in {BUDGET_SECONDS}s"
    assert not found, f"{len(found)} failures:\n" + "\n".join(sorted(found.values()))
