"""Network policies on real sandboxes: off by default (loopback only, names fail at once),
an allowlist reaching its names over HTTP and HTTPS, pip through the policy, set_network
on a running sandbox, one proxy (as nobody) per networked sandbox. What a sandbox must
never reach is test_hostile_network.py's. The "internet" is netprobe's 127.0.0.2/3."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netprobe import (
    FAST,
    HTTP_NAME,
    TLS_NAME,
    internet,
    run,
)

from agent_sandbox import Sandbox
from agent_sandbox.backends.runc.netproxy import namespace as netns
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with internet(tmp_path_factory.mktemp("internet")) as servers:
        yield servers


@pytest.fixture(scope="module")
def listed(net: dict[str, Any]) -> Iterator[Sandbox]:
    """An allowlist sandbox naming both stand-in hosts."""
    sb = Sandbox.create(network=[HTTP_NAME, TLS_NAME])
    sb.files.write("/tmp/ca.pem", net["cert"])
    yield sb
    sb.kill(delete_volume=True)


def test_off_by_default_loopback_only_and_names_fail_at_once(sandbox: Sandbox) -> None:
    assert sandbox.info().network.mode == "off"
    devs = sandbox.commands.run("cat /proc/net/dev").stdout
    assert [d.split(":")[0].strip() for d in devs.splitlines()[2:]] == ["lo"]
    name, ip, udp = run(sandbox, [["resolve", HTTP_NAME], ["tcp", "93.184.216.34", 80],
                                  ["udp", "8.8.8.8", 53]])
    assert isinstance(name[0], str) and name[1] < FAST, name  # gaierror, at once
    assert ip[0] != 0 and ip[1] < FAST, ip
    assert udp[0] != 0 and udp[1] < FAST, udp


def test_allowlist_reaches_its_names_over_http_and_https(listed: Sandbox,
                                                         net: dict[str, Any]) -> None:
    http, tls, proxied = run(listed, [
        ["http", f"http://{HTTP_NAME}:{net['http_port']}/x"],
        ["tls", TLS_NAME, net["tls_port"], TLS_NAME, "/tmp/ca.pem"],
        ["http", f"http://{HTTP_NAME}:{net['http_port']}/y", None, True]])
    assert http[0] == [200, f"hello {HTTP_NAME}:{net['http_port']}\n"], http
    assert tls[0][0] == 200 and tls[0][1].startswith("HTTP/1.0 200"), tls
    assert proxied[0][0] == 200, proxied  # through the explicit proxy (HTTP_PROXY)


def test_pip_installs_through_an_allowlist_and_fails_at_once_without(
        net: dict[str, Any]) -> None:
    index = f"http://{HTTP_NAME}:{net['http_port']}/simple/"
    pip = (f"python3 -m pip install --break-system-packages --no-cache-dir --index-url {index} "
           f"--trusted-host {HTTP_NAME} abxdemo")
    with Sandbox.create(network=TLS_NAME) as sb:
        # pip logs why an index page failed only with -vv; it fails at once either way
        # (a 403 is not retried, unlike a DNS failure or a reset).
        started = time.monotonic()
        res = sb.commands.run(pip + " -vv", timeout=120)
        assert res.exit_code != 0
        assert time.monotonic() - started < 10, "pip must fail at once, not after retries"
        assert "403 Client Error: Forbidden by sandbox network policy" in res.stdout, \
            res.stdout[-1500:]
        sb.set_network([HTTP_NAME])  # while it runs
        res = sb.commands.run(pip, timeout=120)
        assert res.exit_code == 0, res.stderr[-1500:]
        assert sb.commands.run("python3 -c 'import abxdemo; print(abxdemo.VALUE)'"
                               ).stdout.strip() == "42"


def test_set_network_switches_a_running_sandbox(net: dict[str, Any]) -> None:
    url = f"http://{HTTP_NAME}:{net['http_port']}/"
    with Sandbox.create() as sb:
        sb.commands.run("sleep 600", background=True)
        assert run(sb, [["http", url]])[0][0] == "gaierror"
        sb.set_network(HTTP_NAME)
        assert sb.info().network.allow_out == (HTTP_NAME,)
        assert run(sb, [["http", url]])[0][0][0] == 200
        sb.pause()
        sb.resume()
        assert run(sb, [["http", url]])[0][0][0] == 200  # kept over pause/resume
        sb.reset_rootfs()
        assert run(sb, [["http", url]])[0][0][0] == 200  # and over a reset (new netns)
        sb.set_network("off")
        assert run(sb, [["http", url]])[0][0] == "gaierror"
        with pytest.raises(InvalidArgumentError, match="not understood"):
            sb.set_network("http://evil")


def test_the_rules_are_in_the_sandbox_netns(listed: Sandbox) -> None:
    pid = local_provider().backend.runc.state(listed.sandbox_id)["pid"]  # type: ignore[index]
    table = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "nft", "list", "table",
                            "inet", netns.TABLE], capture_output=True, text=True,
                           check=True).stdout
    assert "dnat ip to 10.255.255.1" in table and "reject with tcp reset" in table, table


def test_one_proxy_per_networked_sandbox_and_it_ends_with_it() -> None:
    data = os.path.realpath(os.environ["ABX_DATA_DIR"])

    def proxies() -> set[int]:
        """This engine's proxies (another test worker's have their logs elsewhere)."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (b"agent_sandbox.backends.runc.netproxy" in (entry / "cmdline").read_bytes()
                            and os.readlink(entry / "fd" / "1").startswith(data + "/")):
                        found.add(int(entry.name))
                except OSError:
                    continue
        return found

    before = proxies()
    sb = Sandbox.create(network="registries")
    try:
        sb.reset_rootfs()
        mine = proxies() - before
        assert len(mine) == 1, mine
        status = Path(f"/proc/{mine.pop()}/status").read_text()
        if os.geteuid() == 0:  # the root engine's proxy runs as nobody
            assert "Uid:\t65534\t65534\t65534\t65534" in status, status
    finally:
        sb.kill(delete_volume=True)
    assert proxies() - before == set()
