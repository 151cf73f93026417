"""The memory backend (``ABX_ENGINE=memory``) is a real backend: the real guest in private
namespaces over an in-memory root, records in this process. The service above it behaves
as over runc: what the surface tests that run on it rely on."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from agent_sandbox.core.errors import NotFoundError, WrongStateError
from agent_sandbox.providers.memory import memory_service
from agent_sandbox.service.service import SandboxService

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bwrap is not installed (apt-get install bubblewrap)")]


@pytest.fixture(scope="module")
def service() -> Iterator[SandboxService]:
    svc = memory_service()
    yield svc
    svc.close()


def test_lifecycle_commands_files_and_volumes(service: SandboxService) -> None:
    info = service.create(metadata={"k": "v"}, lifetime=100)
    sid = info.sandbox_id
    assert (info.state, info.template, info.metadata, info.lifetime) == (
        "running", "base", {"k": "v"}, 100)
    assert not info.enforced["isolation"]
    result = service.run(sid, "echo hi; echo err >&2; hostname; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, f"hi\n{sid}\n", "err\n")
    service.write_file(sid, "/workspace/a/b.txt", b"kept")
    assert service.run(sid, "whoami; touch /workspace/u", user="user").stdout == "user\n"
    service.run(sid, "echo x > /tmp/gone")
    service.pause(sid)
    assert service.info(sid).state == "paused"
    assert service.run(sid, "cat /workspace/a/b.txt").stdout == "kept"  # resumed by use
    service.reset_rootfs(sid)
    assert not service.exists(sid, "/tmp/gone") and service.exists(sid, "/workspace/u")
    service.kill(sid)
    with pytest.raises(NotFoundError):
        service.info(sid)
    again = service.create(volume=info.volume_id)
    with pytest.raises(WrongStateError):
        service.create(volume=info.volume_id)  # attached to the new one
    assert b"".join(service.read_file(again.sandbox_id, "/workspace/a/b.txt")) == b"kept"
    service.kill(again.sandbox_id, delete_volume=True)
    assert info.volume_id not in {v.volume_id for v in service.list_volumes()}


def test_nothing_of_the_host_is_writable_and_no_network(service: SandboxService) -> None:
    sid = service.create().sandbox_id
    try:
        out = service.run(sid, "touch /usr/x 2>&1; ls /sys /var 2>&1 | head -1; "
                               "python3 -c 'import socket; socket.create_connection"
                               "((\"1.1.1.1\", 53), timeout=2)' 2>&1 | tail -1").stdout
        assert "Read-only file system" in out and "unreachable" in out.lower()
    finally:
        service.kill(sid, delete_volume=True)


def test_the_reaper_ends_and_pauses_as_over_runc(service: SandboxService) -> None:
    import time

    kept = service.create(timeout=10)
    ended = service.create(timeout=10, on_timeout="kill", keep_volume=False)
    service.reap_once(now=time.time() + 11)
    assert service.info(kept.sandbox_id).state == "paused"
    with pytest.raises(NotFoundError):
        service.info(ended.sandbox_id)
    assert ended.volume_id not in {v.volume_id for v in service.list_volumes()}
    service.kill(kept.sandbox_id, delete_volume=True)


def test_secrets_need_an_engine_that_injects_them(service: SandboxService,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kubernetes backend has no proxy that could send them: refused, saying why, and
    nothing is made."""
    from agent_sandbox.core.errors import InvalidArgumentError

    service.create_secret({"name": "k8s", "hosts": ["api.example.com"]}, "value-123",
                          replace=True)
    before = len(service.list())
    monkeypatch.setattr(service.backend, "injects_secrets", False)
    with pytest.raises(InvalidArgumentError, match="cannot inject secrets"):
        service.create(secrets=["k8s"], network="api.example.com")
    assert len(service.list()) == before
    service.delete_secret("k8s")


def test_a_shortened_timeout_fires_at_its_deadline(service: SandboxService) -> None:
    """The reaper sleeps until the next deadline (``next_reap``), woken by a change: a
    timeout set shorter is acted on when it falls due, not at the next periodic look."""
    import time

    sid = service.create(timeout=600).sandbox_id
    try:
        service.set_timeout(sid, 1)
        due = service.next_reap()
        assert due is not None and due <= service.info(sid).expires_at + 0.5
        give_up = time.monotonic() + 60  # a bound for a stuck reaper, not a timing check
        while service.info(sid).state != "paused" and time.monotonic() < give_up:
            time.sleep(0.05)
        assert service.info(sid).state == "paused"
    finally:
        service.kill(sid, delete_volume=True)


def test_the_log_holds_a_start_commands_output_bounded(service: SandboxService,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A template's start command: what it prints is in the sandbox's log (stderr at
    level error), read from its guest as a bounded tail, each line cut; a flood of it
    (the sandbox writes it: hostile) holds the answer to its bounds."""
    import dataclasses
    import time

    from agent_sandbox.service import sandbox_logs

    base = service.backend.template
    flood = ("python3 -c \"import sys; sys.stdout.write(('x' * 9000 + '\\n') * 400); "
             "sys.stdout.flush(); sys.stderr.write('boom\\n')\"")
    monkeypatch.setattr(service.backend, "template", lambda name, creating=False: (
        dataclasses.replace(base(name, creating=creating), start_cmd=flood)))
    sid = service.create().sandbox_id
    try:
        give_up = time.monotonic() + 60  # a bound for a stuck command, not a timing check
        while time.monotonic() < give_up:
            entries = service.logs(sid)
            if any(e.message == "boom" for e in entries):
                break
            time.sleep(0.1)
        assert entries[0].message.startswith("created from template base")
        assert any(e.message.startswith("start command running") for e in entries)
        started = [e for e in entries if e.source == "start"]
        assert [e.level for e in started if e.message == "boom"] == ["error"]
        assert len(entries) <= sandbox_logs.MAX_ENTRIES
        assert all(len(e.message) <= sandbox_logs.MAX_LINE for e in entries)
        assert sum(len(e.message) for e in started) <= sandbox_logs.START_TAIL * 2
        service.set_timeout(sid, 300)
        assert any(e.message == "idle timeout set to 300 s" for e in service.logs(sid))
    finally:
        service.kill(sid, delete_volume=True)
    with pytest.raises(NotFoundError):
        service.logs(sid)
