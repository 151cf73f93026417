"""Every schema states the bounds the service checks and the guest keeps as literals
(agent_sandbox/core/bounds.py names them): the service must accept each bound and refuse
just past it, so the two cannot drift apart. Then the inputs JSON can carry that
no schema generator sends: lone surrogates, huge integers, a final newline."""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _gw import Gateway
from hypothesis import given
from hypothesis import strategies as st

from agent_sandbox.core import bounds as b
from agent_sandbox.core import validate
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    ResourceExhaustedError,
    SandboxError,
    WrongStateError,
)
from agent_sandbox.providers.local import local_provider
from agent_sandbox.service.service import SandboxService
from agent_sandbox.surfaces.rest import schemas as s

pytestmark = pytest.mark.integration
HOST_CPUS = os.cpu_count() or 1  # the runc backend's bound on cpu
HOST_MEMORY_MB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20  # and memory


@pytest.fixture(scope="module")
def engine() -> SandboxService:
    return local_provider()


@pytest.fixture(scope="module")
def box(engine: SandboxService) -> Iterator[str]:
    sandbox_id = engine.create().sandbox_id
    yield sandbox_id
    engine.kill(sandbox_id, delete_volume=True)


def _accepted(call: Callable[[], Any]) -> None:
    """Past the input checks: it ran, or failed for another reason than its input."""
    try:
        call()
    except InvalidArgumentError as exc:
        pytest.fail(f"refused: {exc}")
    except SandboxError:
        pass


def test_engine_keeps_the_bounds_the_schema_states(engine: SandboxService, box: str) -> None:
    pid = engine.start(box, "sleep 600")
    done = engine.start(box, "true")
    engine.write_file(box, "/workspace/f", b"x")
    cases: list[tuple[Callable[[Any], Any], Any, Any]] = [
        # (call, the bound, just past it)
        (lambda t: engine.run(box, "true", timeout=t),
         b.MAX_COMMAND_TIMEOUT, b.MAX_COMMAND_TIMEOUT + 0.5),
        (lambda t: engine.wait(box, done, timeout=t), b.MAX_COMMAND_TIMEOUT, 1e300),
        (lambda t: engine.run_code(box, "1", timeout=t),
         b.MAX_COMMAND_TIMEOUT, b.MAX_COMMAND_TIMEOUT + 1),
        (lambda t: engine.set_timeout(box, t), b.MAX_SANDBOX_TIMEOUT,
         b.MAX_SANDBOX_TIMEOUT + 1),
        (lambda p: engine.process_output(box, p), b.MAX_PID, b.MAX_PID + 1),
        (lambda p: engine.process_output(box, p), 1, 0),
        # The engine takes one more character than the kernel, which the gateway states.
        (lambda n: engine.exists(box, "/" + "a" * (n - 1)), b.MAX_PATH, b.MAX_PATH + 2),
        (lambda d: engine.list_files(box, "/workspace", depth=d), b.MAX_DEPTH,
         b.MAX_DEPTH + 1),
        (lambda m: engine.write_file(box, "/workspace/f", b"x", mode=m), b.MAX_MODE,
         b.MAX_MODE + 1),
        # A file's metadata: names (with their user.e2b. prefix) and values, in bytes.
        (lambda n: engine.write_file(box, "/workspace/f", b"x", metadata={
            "k": "v" * (n - len("user.e2b.k"))}), b.MAX_FILE_METADATA,
         b.MAX_FILE_METADATA + 1),
        (lambda o: list(engine.read_file(box, "/workspace/f", offset=o)),
         b.MAX_FILE_OFFSET, b.MAX_FILE_OFFSET + 1),
        (lambda n: list(engine.read_file(box, "/workspace/f", limit=n)),
         b.MAX_FILE_OFFSET, b.MAX_FILE_OFFSET + 1),
        (lambda n: engine.kill_process(box, pid, n), b.MAX_SIGNAL, b.MAX_SIGNAL + 1),
        (lambda n: engine.kill_process(box, pid, n), b.MIN_SIGNAL, b.MIN_SIGNAL - 1),
        (lambda lang: engine.run_code(box, "1", language=lang), s.LANGUAGES[-1], "ruby"),
        (lambda state: engine.list(state=state), s.SANDBOX_STATES[-1], "creating"),
        (lambda n: engine.create(memory_mb=n), None, b.MIN_MEMORY_MB - 1),
        (lambda n: engine.create(memory_mb=n), None, b.MAX_MEMORY_MB + 1),
        (lambda n: engine.create(disk_mb=n), None, b.MIN_DISK_MB - 1),
        (lambda n: engine.create(disk_mb=n), None, b.MAX_DISK_MB + 1),
        (lambda n: engine.create(cpu=n), None, HOST_CPUS + 0.5),
        (lambda t: engine.create(timeout=t), None, b.MAX_SANDBOX_TIMEOUT + 1),
    ]
    for call, bound, past in cases:
        if bound is not None:
            _accepted(lambda c=call, b=bound: c(b))  # type: ignore[misc]
        with pytest.raises(InvalidArgumentError):
            call(past)
    for language in s.LANGUAGES:
        with pytest.raises(WrongStateError):  # past the checks: base has no kernel
            engine.run_code(box, "1", language=language)


def test_the_guest_keeps_the_file_metadata_bound() -> None:
    from agent_sandbox.guest import limits

    assert limits.MAX_FILE_METADATA == b.MAX_FILE_METADATA


def test_engine_creates_at_the_bounds(engine: SandboxService) -> None:
    for kw in ({"memory_mb": b.MIN_MEMORY_MB, "disk_mb": b.MIN_DISK_MB, "cpu": HOST_CPUS,
                "timeout": b.MAX_SANDBOX_TIMEOUT},
               {"memory_mb": HOST_MEMORY_MB, "cpu": b.MIN_CPU}):
        info = engine.create(**kw)
        engine.kill(info.sandbox_id, delete_volume=True)
    try:  # past every argument check, then refused by the space the host really has
        info = engine.create(disk_mb=b.MAX_DISK_MB)
        engine.kill(info.sandbox_id, delete_volume=True)
    except ResourceExhaustedError as exc:
        assert "host disk too full" in str(exc), exc


@given(st.from_regex(s.BASE64_PATTERN, fullmatch=True))
def test_what_the_base64_pattern_allows_decodes(text: str) -> None:
    try:
        s.base64_bytes(text, "data_base64")
    except (binascii.Error, ValueError):
        pytest.fail(f"{text!r} matches the pattern but does not decode")


@given(st.text(alphabet="AB+/=\n", max_size=9))
def test_base64_is_exactly_the_pattern(text: str) -> None:
    if re.fullmatch(s.BASE64_PATTERN, text):
        assert s.base64_bytes(text, "x") == base64.b64decode(text)
    else:
        with pytest.raises(InvalidArgumentError):
            s.base64_bytes(text, "x")


@given(st.text(max_size=6))
def test_command_pattern_is_the_engines_check(text: str) -> None:
    try:
        validate.command(text)
        accepted = True
    except InvalidArgumentError:
        accepted = False
    assert accepted == bool(re.fullmatch(s.COMMAND_PATTERN, text)), repr(text)


_NAMES = st.one_of(st.sampled_from(["", ".", "..", "...", ".a", "..a"]),
                  st.integers(1, b.MAX_NAME + 5).map(lambda n: "x" * n),
                  st.text(alphabet="ab.", max_size=4))


@given(st.lists(_NAMES, min_size=1, max_size=20).map(lambda names: "/" + "/".join(names)))
def test_path_checks_are_the_path_schemas(path: str) -> None:
    for file, spare in ((False, 0), (True, 0), (True, s.WRITE_SPARE)):
        schema = s.path_schema(file=file, spare=spare)
        allowed = len(path) <= schema["maxLength"] and bool(re.fullmatch(schema["pattern"], path))
        try:
            s.checked_path(path, "path", file=file, spare=spare)
            accepted = True
        except InvalidArgumentError:
            accepted = False
        assert accepted == allowed, (file, spare, len(path), path[-40:])


def _raw(http: Any, method: str, url: str, body: str) -> Any:
    return http.request(method, url, content=body.encode(),
                        headers={"Content-Type": "application/json"})


def test_inputs_json_can_carry(gw: Gateway, sandbox_a: str) -> None:
    sb = f"/v1/sandboxes/{sandbox_a}"
    with gw.http("a") as http:
        refused = [
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "echo \\ud800"}'),
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "cat", "stdin": "\\udfff"}'),
            _raw(http, "POST", f"{sb}/files/mkdir", '{"path": "/workspace/\\ud800"}'),
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "true", "envs": {"\\ud800": ""}}'),
            _raw(http, "POST", "/v1/sandboxes", '{"memory_mb": 1' + "0" * 400 + "}"),
            _raw(http, "POST", "/v1/sandboxes", '{"disk_mb": -1' + "0" * 400 + "}"),
            _raw(http, "POST", "/v1/sandboxes", '{"timeout": NaN}'),
            _raw(http, "POST", "/v1/sandboxes", '{"timeout": Infinity}'),
            _raw(http, "POST", "/v1/sandboxes", '{"timeout": "300"}'),
            _raw(http, "POST", "/v1/sandboxes", '{"network": 1}'),
            _raw(http, "POST", "/v1/sandboxes", '{"cpu": 0.0099}'),
            _raw(http, "POST", f"{sb}/processes/1/kill", '{"signal": true}'),
            _raw(http, "POST", f"{sb}/processes/1/kill", '{"signal": 9.5}'),
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "true", "envs": {"A\\n": ""}}'),
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "cat", "stdin_base64": "QUJD\\n"}'),
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "\\u001c"}'),
            http.get(f"{sb}/processes/1{'0' * 400}/output"),
            http.get(f"{sb}/files", params={"path": "/", "depth": "1" + "0" * 400}),
            http.get(f"{sb}/files/content", params={"path": "/etc/hostname",
                                                    "limit": "1" + "0" * 400}),
            http.get(f"{sb}/files/content", params={"path": "/"}),
            http.get(f"{sb}/files/content", params={"path": "/etc/"}),
            http.put(f"{sb}/files/content", params={"path": "/workspace/."}, content=b"x"),
            http.delete(f"{sb}/files", params={"path": "/workspace/.."}),
            http.post(f"{sb}/files/rename", json={"src": "/workspace/a", "dst": "/"}),
            http.put(f"{sb}/files/content", content=b"x", params={
                "path": "/workspace/" + "w" * (b.MAX_NAME - s.WRITE_SPARE + 1)}),
            http.get(f"{sb}/files/stat", params={"path": "/" + "a" * (b.MAX_NAME + 1)}),
            http.get(f"{sb}/files/exists", params={"path": "/a" * (b.MAX_PATH // 2 + 1)}),
            http.get(f"/v1/sandboxes/{sandbox_a}%0A"),
            http.post(f"/v1/sandboxes/{sandbox_a}%0A/commands", json={"cmd": "true",
                                                                        "stream": True}),
        ]
        accepted = [
            _raw(http, "POST", f"{sb}/commands", '{"cmd": "true", "cwd": ""}'),
            _raw(http, "POST", f"{sb}/commands",
                 '{"cmd": "cat", "stdin": "x", "stdin_base64": null}'),
            _raw(http, "POST", f"{sb}/processes/4194304/kill", '{"signal": 9.0}'),
            http.post(f"{sb}/files/mkdir", json={"path": "/workspace/d/"}),
            http.put(f"{sb}/files/content", content=b"x", params={
                "path": "/workspace/" + "w" * (b.MAX_NAME - s.WRITE_SPARE)}),
            http.get(f"{sb}/files/exists", params={"path": "/a" * (b.MAX_PATH // 2)}),
            http.get(f"{sb}/files/stat", params={"path": "/workspace/" + "a" * b.MAX_NAME}),
        ]
    for response in refused:
        assert response.status_code == 400, (response.request.url, response.text)
        assert response.json()["code"] == "invalid_argument", response.text
    for response in accepted:
        assert response.status_code in (200, 204, 404), (response.request.url, response.text)
