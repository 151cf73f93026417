"""Reads are bounded for the caller: a sandbox can make any file endless (a link to
/dev/zero), so ``files.read`` stops at ``max_bytes`` with a clear error, and only regular
files are read at all (devices, FIFOs, sockets are refused at once)."""

from __future__ import annotations

import time

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError

pytestmark = pytest.mark.integration


def test_endless_file_is_refused_not_buffered(sandbox: Sandbox) -> None:
    sandbox.commands.run("ln -sf /dev/zero /workspace/zero")
    for path in ("/workspace/zero", "/dev/zero", "/dev/urandom"):
        began = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="character device, not a regular file"):
            sandbox.files.read(path, format="bytes")
        assert time.monotonic() - began < 5


@pytest.mark.parametrize("path", ["/dev/ptmx", "/dev/tty", "/dev/null"])
def test_devices_answer_at_once(sandbox: Sandbox, path: str) -> None:
    began = time.monotonic()
    with pytest.raises(InvalidArgumentError):
        sandbox.files.read(path)
    assert time.monotonic() - began < 5


def test_max_bytes(sandbox: Sandbox) -> None:
    sandbox.commands.run("head -c 5000000 /dev/zero > /workspace/five")
    with pytest.raises(InvalidArgumentError, match="larger than max_bytes=1000000"):
        sandbox.files.read("/workspace/five", format="bytes", max_bytes=1_000_000)
    assert len(sandbox.files.read("/workspace/five", format="bytes")) == 5_000_000
    exact = sandbox.files.read("/workspace/five", format="bytes", max_bytes=5_000_000)
    assert len(exact) == 5_000_000
    streamed = sum(len(c) for c in sandbox.files.read("/workspace/five", format="stream"))
    assert streamed == 5_000_000
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        sandbox.files.read("/workspace/five", max_bytes=-1)


def test_proc_files_still_read(sandbox: Sandbox) -> None:
    assert "Pid:" in sandbox.files.read("/proc/self/status")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/proc/self/fd/0",
                                  "/proc/version", "/sys/kernel/abx", "/.abx/guest/x"])
def test_writes_where_no_file_can_be_are_invalid(sandbox: Sandbox, path: str) -> None:
    """Devices, /proc, read-only mounts: a clear invalid_argument naming the path, at once;
    the device stays what it was."""
    with pytest.raises(InvalidArgumentError, match=path.replace(".", r"\.")):
        sandbox.files.write(path, b"x")
    assert sandbox.commands.run("test -c /dev/zero && test -c /dev/null").exit_code == 0


def test_fifo_is_not_written(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("mkfifo /workspace/pipe").exit_code == 0
    started = time.monotonic()
    with pytest.raises(InvalidArgumentError, match="fifo"):
        sandbox.files.write("/workspace/pipe", b"x")
    assert time.monotonic() - started < 10
