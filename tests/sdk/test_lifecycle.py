"""The whole life of a sandbox through the public SDK, on real runc containers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError

pytestmark = pytest.mark.integration


def test_create_run_files_pause_resume_reset_kill() -> None:
    sb = Sandbox.create(metadata={"purpose": "lifecycle"})
    try:
        assert sb.sandbox_id.startswith("sbx-")
        assert sb.template == "base"
        assert sb.state == "running"

        result = sb.commands.run("echo hello; echo oops >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "hello\n", "oops\n")

        sb.files.write("/workspace/notes/a.txt", "kept across reset\n")
        assert sb.files.read("/workspace/notes/a.txt") == "kept across reset\n"
        assert sb.commands.run("cat /workspace/notes/a.txt").stdout == "kept across reset\n"

        # A change to the system layer, as `pip install` or `apt` would make.
        assert sb.commands.run("echo tool > /usr/local/bin/mytool && "
                               "chmod +x /usr/local/bin/mytool").exit_code == 0
        assert sb.files.exists("/usr/local/bin/mytool")

        # A background process, to show pause really freezes it.
        ticker = sb.commands.run("while :; do date +%s%N >> /workspace/ticks; sleep 0.05; "
                                 "done", background=True)
        time.sleep(0.3)
        sb.pause()
        assert sb.state == "paused"
        assert Sandbox.list(state="paused")[0].sandbox_id in {
            s.sandbox_id for s in Sandbox.list(state="paused")}
        frozen = sb.info()
        time.sleep(0.4)
        assert sb.info().state == "paused"

        # Any use resumes it.
        lines_before = len(sb.files.read("/workspace/ticks").splitlines())
        assert sb.state == "running"
        time.sleep(0.3)
        lines_after = len(sb.files.read("/workspace/ticks").splitlines())
        assert frozen.state == "paused"
        if os.environ.get("ABX_ENGINE") == "kubernetes":
            # A cluster keeps a paused sandbox's files, not its memory: resumed in a new
            # Pod, without the ticker (docs/kubernetes.md).
            assert lines_after == lines_before
            assert not [p for p in sb.commands.list() if "ticks" in p.cmd]
        else:  # frozen, then thawed: the same process ticks on
            assert lines_after > lines_before
            ticker.kill()

        sb.reset_rootfs()
        assert sb.state == "running"
        assert not sb.files.exists("/usr/local/bin/mytool")
        assert sb.files.read("/workspace/notes/a.txt") == "kept across reset\n"
        assert sb.info().metadata == {"purpose": "lifecycle"}
    finally:
        sb.kill(delete_volume=True)
    with pytest.raises(NotFoundError):
        sb.info()
    with pytest.raises(NotFoundError):
        Sandbox.connect(sb.sandbox_id)
    assert sb.sandbox_id not in {s.sandbox_id for s in Sandbox.list()}


def test_two_sandboxes_cannot_see_each_other() -> None:
    with Sandbox.create() as a, Sandbox.create() as b:
        a.files.write("/workspace/secret-a", "A")
        a.commands.run("echo A > /tmp/secret-tmp")
        a.commands.run("sleep 300", background=True)
        assert not b.files.exists("/workspace/secret-a")
        assert not b.files.exists("/tmp/secret-tmp")
        # Nothing of a's runs in b's pid namespace.
        ps_b = b.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
        assert "sleep 300" not in ps_b
        assert a.commands.run("hostname").stdout.strip() == a.sandbox_id
        assert b.commands.run("hostname").stdout.strip() == b.sandbox_id


def test_connect_list_and_filters() -> None:
    with Sandbox.create(envs={"GREETING": "hi"}) as sb:
        same = Sandbox.connect(sb.sandbox_id)
        assert same.commands.run("echo $GREETING").stdout == "hi\n"
        assert sb.sandbox_id in {s.sandbox_id for s in Sandbox.list(template="base")}
        assert sb.sandbox_id not in {s.sandbox_id for s in Sandbox.list(template="nope")}
        assert sb.sandbox_id in {s.sandbox_id for s in Sandbox.list(state="running")}
        info = sb.info()
        # A cluster's volume sizes are its storage's business: not enforced by us.
        disk_enforced = os.environ.get("ABX_ENGINE") != "kubernetes"
        assert info.limits["memory_mb"] > 0 and info.enforced["disk"] is disk_enforced
        assert info.expires_at > time.time()


def test_kept_volume_attaches_to_a_new_sandbox() -> None:
    first = Sandbox.create()
    first.files.write("/workspace/data.csv", "a,b\n1,2\n")
    first.commands.run("touch /etc/system-change")
    volume = first.info().volume_id
    first.kill()  # delete_volume=False: the volume stays
    second = Sandbox.create(volume=volume)
    try:
        assert second.files.read("/workspace/data.csv") == "a,b\n1,2\n"
        assert not second.files.exists("/etc/system-change")
        with pytest.raises(WrongStateError):
            Sandbox.create(volume=volume)  # attached already
    finally:
        second.kill(delete_volume=True)
    with pytest.raises(NotFoundError):
        Sandbox.create(volume=volume)


def _reaper() -> Any:
    """What pauses idle sandboxes: this host's engine (the gateway shares its store), or
    the Kubernetes provider's supervisor."""
    from agent_sandbox.providers.local import local_provider
    from agent_sandbox.providers.select import default_provider

    return default_provider() if os.environ.get("ABX_ENGINE") == "kubernetes" \
        else local_provider()


def test_idle_timeout_auto_pauses_and_use_extends() -> None:
    with Sandbox.create(timeout=1) as sb:
        time.sleep(1.2)
        _reaper().reap_once()
        assert sb.info().state == "paused"
        assert sb.commands.run("echo back").stdout == "back\n"
        assert sb.info().state == "running"
        sb.set_timeout(600)
        _reaper().reap_once()
        assert sb.info().state == "running"


def test_calls_in_flight_are_activity() -> None:
    """An 8 s command and an upload paced over 6 s, with a 3 s idle timeout and the real
    reaper running: both complete; the idle timeout starts when the last call ends."""
    with Sandbox.create(timeout=3) as sb:
        result = sb.commands.run("sleep 8; echo finished", timeout=60)
        assert (result.exit_code, result.stdout) == (0, "finished\n")

        def paced() -> Iterator[bytes]:
            for _ in range(12):
                time.sleep(0.5)
                yield b"x" * (1 << 20)

        assert sb.files.write("/workspace/upload.bin", paced()) == 12 << 20
        ended = time.monotonic()
        assert sb.info().state == "running"
        time.sleep(1.5)
        assert sb.info().state == "running", "paused before its idle timeout"
        while sb.info().state != "paused":
            assert time.monotonic() - ended < 20, "never paused after the last call ended"
            time.sleep(0.25)
        assert sb.commands.run("wc -c < /workspace/upload.bin").stdout == f"{12 << 20}\n"


def test_long_paused_sandbox_releases_memory_and_boots_again() -> None:
    from snapshotting import memory_snapshots_missing

    from agent_sandbox.providers.local import local_provider

    engine = local_provider()
    checkpoints = memory_snapshots_missing(engine) is None
    with Sandbox.create(timeout=1) as sb:
        sb.files.write("/workspace/kept.txt", "disk survives")
        sb.commands.run("sleep 1000", background=True)
        later = time.time() + 1 + engine.config.paused_stop_after + 5
        engine.reap_once(now=time.time() + 2)  # idle: paused (checkpointed, or frozen)
        assert sb.info().state == "paused"
        engine.reap_once(now=later)  # paused for long: no container holds its memory
        assert engine.backend.runc.state(sb.sandbox_id) is None
        assert sb.info().state == "paused"
        # Any use starts it again on the same disk; its processes are back where a
        # checkpoint kept them (with CRIU), gone where its container was stopped.
        assert sb.files.read("/workspace/kept.txt") == "disk survives"
        assert sb.info().state == "running"
        kept = [p for p in sb.commands.list() if "sleep 1000" in p.cmd]
        assert bool(kept) is checkpoints, kept


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"template": "no-such-template"}, "not found"),
        ({"template": "../etc"}, "invalid template name"),
        ({"memory_mb": -1}, "memory_mb must be greater than 0"),
        ({"cpu": 0}, "cpu must be greater than 0"),
        ({"disk_mb": 1.5}, "disk_mb must be a whole number"),
        ({"timeout": -5}, "timeout must be greater than 0"),
        ({"envs": {"BAD-NAME": "x"}}, "invalid environment variable name"),
        ({"envs": {"A": "x\x00y"}}, "without NUL"),
        ({"volume": "vol-missing"}, "not found"),
    ],
)
def test_create_rejects_bad_input(kwargs: dict, message: str) -> None:
    before = {s.sandbox_id for s in Sandbox.list()}
    with pytest.raises((InvalidArgumentError, NotFoundError), match=message):
        Sandbox.create(**kwargs)
    assert {s.sandbox_id for s in Sandbox.list()} == before


@pytest.mark.parametrize("bad_id", ["", "sbx-../../etc", "x" * 300, "sbx-ABCDEFGHIJ"])
def test_connect_rejects_bad_ids(bad_id: str) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid sandbox id"):
        Sandbox.connect(bad_id)


def test_unknown_sandbox_is_not_found() -> None:
    with pytest.raises(NotFoundError, match="not found"):
        Sandbox.connect("sbx-0000000000")
