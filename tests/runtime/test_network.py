"""Networking: none but loopback by default; user-mode NAT on request, host unreachable."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
def host_listener() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


def _connect(sb: Sandbox, host: str, port: int) -> str:
    code = (f"import socket; s=socket.socket(); s.settimeout(2); "
            f"s.connect(({host!r}, {port})); print('CONNECTED')")
    r = sb.commands.run(f'python3 -c "{code}"')
    return r.stdout + r.stderr


def _interfaces(sb: Sandbox) -> set[str]:
    lines = sb.commands.run("cat /proc/net/dev").stdout.splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines}


def test_default_sandbox_has_only_loopback(sandbox: Sandbox, host_listener: int) -> None:
    assert _interfaces(sandbox) == {"lo"}
    out = _connect(sandbox, "127.0.0.1", host_listener)
    assert "CONNECTED" not in out and "Connection refused" in out
    # Its own loopback works: a server and a client inside the sandbox.
    sandbox.commands.run("python3 -m http.server 8123 --bind 127.0.0.1", background=True)
    r = sandbox.commands.run(
        "for i in $(seq 50); do python3 -c \"import urllib.request as u; "
        "print(u.urlopen('http://127.0.0.1:8123/').status)\" 2>/dev/null && break; "
        "sleep 0.1; done")
    assert r.stdout.strip().endswith("200")


@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="slirp4netns not installed")
def test_network_true_adds_nat_but_not_the_host(host_listener: int) -> None:
    with Sandbox.create(network=True) as sb:
        assert sb.info().network is True
        assert _interfaces(sb) == {"lo", "tap0"}
        routes = sb.commands.run("cat /proc/net/route").stdout
        assert "00000000" in routes.split("\n", 1)[1]  # a default route exists
        # slirp's alias for the host's loopback is disabled.
        assert "CONNECTED" not in _connect(sb, "10.0.2.2", host_listener)
        assert "CONNECTED" not in _connect(sb, "127.0.0.1", host_listener)


def _slirps() -> dict[int, list[str]]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if argv and Path(argv[0]).name == "slirp4netns":
                out[int(entry.name)] = argv
    return out


@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="slirp4netns not installed")
def test_reboots_leave_one_slirp4netns() -> None:
    """reset_rootfs and a guest reboot each make a new netns: the old helper ends."""
    before = set(_slirps())
    with Sandbox.create(network=True) as sb:
        for step in ("reset", "reboot", "reset"):
            if step == "reset":
                sb.reset_rootfs()
            else:
                sb.commands.run("(sleep 0.2; kill -TERM 1) >/dev/null 2>&1 &")
                time.sleep(1)
            assert sb.commands.run("cat /proc/net/dev").stdout.count("tap0") == 1
            mine = set(_slirps()) - before
            assert len(mine) == 1, (step, mine)
    assert not set(_slirps()) - before
