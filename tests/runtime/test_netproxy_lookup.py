"""The policy proxy started as the engine starts it (backends/runc/netproxy/launch: the
Python it picks, as nobody, the same checks before it says it serves), resolving names
through the host's real lookup path — getaddrinfo, nsswitch, /etc/resolv.conf, DNS — never
through names pinned with ABX_NETWORK_HOSTS: a private mount namespace gives the proxy an
/etc/resolv.conf naming a DNS server this test runs on a loopback address, and asks the
proxy's DNS server (netproc.probe, what ``abx doctor`` runs) what a sandbox would be told.
Also from a Python nobody can read (the base interpreter bind-mounted into a 0700
directory, as a pyenv under /root is): the proxy there used to fail its first lookup on a
module it imports on first use (concurrent.futures.thread), so every allowed name was
refused or reset while the pinned names of the other tests worked."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from agent_sandbox.backends.runc.netproxy import launch as netproc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces, nobody)"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare"),
]

ZONE = {"registry.test": "93.184.216.34", "reserved.test": "203.0.113.80"}
NAMES = [*ZONE, "missing.test"]

# Run inside the mount namespace: probe NAMES under a policy, print what came back.
_SCRIPT = textwrap.dedent("""
    import json, sys
    from agent_sandbox.backends.runc.netproxy import launch as netproc
    from agent_sandbox.config.engine import EngineConfig
    args = json.loads(sys.argv[1])
    out = {"python": sys.executable}
    runtimes = {"engine": netproc.proxy_runtime(), "own": netproc.Runtime(sys.executable)}
    for key, runtime in runtimes.items():
        try:
            probe = netproc.probe(args["names"], args["policy"],
                                  EngineConfig(network_open_ranges=tuple(args["open"])),
                                  runtime=runtime)
            out[key] = {"python": runtime.python, "readable": runtime.readable,
                        "note": runtime.note, "answers": probe.answers}
        except Exception as exc:
            out[key] = {"python": runtime.python, "error": str(exc)}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def nameserver() -> Iterator[str]:
    """A DNS server on a loopback address, port 53 (resolv.conf names no other port):
    ZONE's A records, NOERROR without data for their other types, NXDOMAIN for the rest."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = ""
    for _ in range(20):
        address = f"127.53.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        pytest.skip("no free loopback address for a DNS server on port 53")

    def serve() -> None:
        while True:
            try:
                data, peer = sock.recvfrom(4096)
            except OSError:
                return  # closed
            try:
                query = dns.message.from_wire(data)
            except Exception:  # noqa: BLE001 - not a query
                continue
            reply = dns.message.make_response(query)
            question = query.question[0]
            name = question.name.to_text(omit_final_dot=True).lower()
            if name not in ZONE:
                reply.set_rcode(dns.rcode.NXDOMAIN)
            elif question.rdtype == dns.rdatatype.A:
                reply.answer.append(dns.rrset.from_text(question.name, 60, "IN", "A",
                                                        ZONE[name]))
            sock.sendto(reply.to_wire(), peer)

    threading.Thread(target=serve, daemon=True).start()
    yield address
    sock.close()


def _probe(tmp: Path, nameserver: str, policy: Any, open_ranges: tuple[str, ...] = (),
           hide_python: bool = False) -> dict[str, Any]:
    """Run _SCRIPT in a private mount namespace whose /etc/resolv.conf names only
    ``nameserver`` (hosts: files, then DNS); ``hide_python``: on the base interpreter
    bind-mounted into a 0700 directory, which nobody cannot enter."""
    (tmp / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:1 attempts:2\n")
    (tmp / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp / "nsswitch.conf").write_text("hosts: files dns\n")
    steps = [f"mount --bind {tmp / name} /etc/{name}"
             for name in ("resolv.conf", "hosts", "nsswitch.conf")]
    python = sys.executable
    if hide_python:
        hidden = tmp / "hidden"
        hidden.mkdir(mode=0o700)
        (hidden / "py").mkdir()
        steps.append(f"mount --bind {sys.base_prefix} {hidden / 'py'}")
        real = Path(os.path.realpath(sys.executable))
        python = str(hidden / "py" / real.relative_to(sys.base_prefix))
    script = " && ".join([*steps, 'exec "$0" -c "$1" "$2"'])
    env = {**os.environ, "PYTHONPATH": netproc.proxy_env()["PYTHONPATH"]}
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", script, python,
         _SCRIPT, json.dumps({"names": NAMES, "policy": policy, "open": list(open_ranges)})],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_answers(found: dict[str, Any], opened: bool = False) -> None:
    assert "error" not in found, found
    answers = found["answers"]
    assert answers["registry.test"] == "", answers  # resolves, to an address it may reach
    assert answers["missing.test"] == "missing.test does not resolve (NXDOMAIN)", answers
    if opened:
        assert answers["reserved.test"] == "", answers
    else:  # the address, its range and the setting that opens it
        assert answers["reserved.test"].startswith(
            "reserved.test resolves only to 203.0.113.80 (in 203.0.113.0/24)"), answers
        assert "ABX_NETWORK_OPEN_RANGES=203.0.113.80/32" in answers["reserved.test"], answers


def test_the_proxy_resolves_real_names_through_the_hosts_resolver(
        tmp_path: Path, nameserver: str) -> None:
    out = _probe(tmp_path, nameserver, NAMES)
    _check_answers(out["engine"])
    assert out["engine"]["readable"], out["engine"]
    (tmp_path / "opened").mkdir()
    out = _probe(tmp_path / "opened", nameserver, NAMES, ("203.0.113.80/32",))
    _check_answers(out["engine"], opened=True)


def test_a_python_nobody_cannot_read_is_replaced_and_the_proxy_still_resolves(
        tmp_path: Path, nameserver: str) -> None:
    """The engine on a Python nobody cannot read runs its proxy on one nobody can; forced
    onto the unreadable one, the proxy still resolves names (what it imports on first
    use is imported before it drops privileges, and it proves a lookup before it says it
    serves)."""
    out = _probe(tmp_path, nameserver, NAMES, hide_python=True)
    hidden = out["python"]
    assert out["own"]["python"] == hidden
    _check_answers(out["own"])
    engine = out["engine"]
    if any(os.path.exists(p) for p in ("/usr/bin/python3", "/usr/local/bin/python3")):
        assert engine["python"] != hidden and engine["readable"], engine
        assert f"cannot read the engine's Python {hidden}" in engine["note"], engine
        _check_answers(engine)
    else:
        assert engine["python"] == hidden and not engine["readable"], engine


def test_the_engines_proxy_python_imports_the_proxy_as_nobody() -> None:
    """The guard: whatever Python the engine picks for its proxy, nobody can import the
    proxy's whole module graph from it, the modules imported on first use included."""
    runtime = netproc.proxy_runtime()
    assert runtime.readable, runtime
    assert netproc.imports_as_nobody(runtime.python) == "", runtime
