"""``abx sandbox exec`` as a person uses it: piped stdin, Ctrl-C / SIGTERM stopping the
command inside, words without ``--``, exit codes, ``--user``; on this host's engine and
through a gateway."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration

Abx = Any  # the ``abx`` fixture of tests/cli/conftest.py


@pytest.fixture(params=["local", "gateway"])
def where(request: pytest.FixtureRequest, abx: Abx) -> dict[str, str]:
    """The environment that makes abx use this host's engine, or the gateway."""
    if request.param == "gateway":
        return {"ABX_SANDBOX_BASE_URL": request.getfixturevalue("gateway").url}
    return {}


@pytest.fixture
def sid(abx: Abx, where: dict[str, str]) -> Iterator[str]:
    sandbox_id = abx("sandbox", "create", "--json", env=where, timeout=120).json()["sandbox_id"]
    yield sandbox_id
    abx("sandbox", "kill", sandbox_id, "--delete-volume", env=where, check=None)


def _popen(abx: Abx, where: dict[str, str], *args: str, **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([*abx.command, "sandbox", "exec", *args], cwd=abx.cwd,
                            env={**abx.env, **where}, **kw)


def _run(abx: Abx, where: dict[str, str], *args: str, data: bytes | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*abx.command, "sandbox", "exec", *args], cwd=abx.cwd,
                          env={**abx.env, **where}, input=data, capture_output=True,
                          timeout=timeout)


def _alive(abx: Abx, where: dict[str, str], sid: str, marker: str) -> bool:
    r = abx("sandbox", "exec", sid, f"ps -eo args | grep -v grep | grep -c '{marker}' || true",
            env=where)
    return r.out.strip() != "0"


def test_piped_stdin_reaches_the_command(abx: Abx, where: dict[str, str], sid: str) -> None:
    assert _run(abx, where, sid, "cat", data=b"foo\n").stdout == b"foo\n"
    data = os.urandom(4 << 20)
    r = _run(abx, where, sid, "sha256sum", data=data)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), r.stderr
    # --no-stdin: the command reads nothing, even from a pipe.
    assert _run(abx, where, "--no-stdin", sid, "wc -c", data=b"ignored").stdout == b"0\n"
    # A stream, not a whole: the command answers the first line before the second exists.
    proc = _popen(abx, where, sid, "while read l; do echo got-$l; done",
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"one\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"got-one\n"
    proc.stdin.write(b"two\n")
    proc.stdin.close()
    assert proc.stdout.read() == b"got-two\n" and proc.wait(60) == 0


def test_words_exit_codes_and_user(abx: Abx, where: dict[str, str], sid: str) -> None:
    r = abx("sandbox", "exec", sid, "ls", "-la", "/workspace", env=where)
    assert "total" in r.out and " . " not in r.err
    assert abx("sandbox", "exec", sid, "sh", "-c", "exit 7", env=where, check=7)
    r = abx("sandbox", "exec", sid, "--timeout", "1", "sleep", "20", env=where, check=124)
    assert "timed out after 1s" in r.err
    res = abx("sandbox", "exec", "--json", "--timeout", "1", sid, "sleep 20", env=where,
              check=124).json()
    assert (res["exit_code"], res["timed_out"]) == (124, True)  # the SDK's code, too
    abx("sandbox", "exec", sid, "kill -KILL $$", env=where, check=137)
    r = abx("sandbox", "exec", "-u", "user", sid, "id", "-un", env=where)
    assert r.out == "user\n"
    r = abx("sandbox", "exec", sid, "--user", "ghost", "true", env=where, check=1)
    assert "no user 'ghost'" in r.err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_on_abx_stops_the_command_inside(abx: Abx, where: dict[str, str], sid: str,
                                                   sig: int) -> None:
    proc = _popen(abx, where, sid, "echo started; sleep 43; echo never",
                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    assert _alive(abx, where, sid, "sleep 43")
    begun = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig and b"never" not in out
    assert b"was stopped" in err and b"Traceback" not in err
    deadline = time.monotonic() + 10
    while _alive(abx, where, sid, "sleep 43") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(abx, where, sid, "sleep 43"), "the command outlived abx"
    print(f"{signal.Signals(sig).name}: abx exited and the command was gone within "
          f"{time.monotonic() - begun:.2f}s")


def test_a_closed_stdout_stops_the_command(abx: Abx, where: dict[str, str], sid: str) -> None:
    proc = _popen(abx, where, sid, "yes", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"y\n"
    proc.stdout.close()  # as `| head -1` does
    assert proc.wait(30) == 141
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    deadline = time.monotonic() + 10
    while _alive(abx, where, sid, "^yes") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(abx, where, sid, "^yes")
