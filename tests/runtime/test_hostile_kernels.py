"""The code interpreter must not trust the sandbox either.

A sandbox's root owns its run directory (where the kernel's sockets live), its kernel
and the interpreter the kernel bridge runs on. It plants links where the sockets were,
floods output past every deadline, or replaces the bridge with a program that lies: the
host connects to nothing it planted, each call ends on time with a clear answer, and the
host keeps a bounded amount of what was sent. Run as root here and as an ordinary user
by ``rootless_battery.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_hostile_host import _assert_never_connected, _host_listener, _within
from test_hostile_host import tag as tag  # the fixture

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import NotFoundError, SandboxError
from agent_sandbox.core.models import Execution

pytestmark = pytest.mark.integration

TEMPLATE = "code-interpreter-v1"
CELL_CAP = 32 << 20  # kernel_cell.MAX_CELL_OUTPUT
RSS_GROWTH = 400 << 20  # what one flooded call may cost the host, generously


@pytest.fixture(scope="module", autouse=True)
def _template(code_template: str) -> None:
    """Build code-interpreter-v1 once per session (the rootless battery has its own)."""


@contextmanager
def _code_sandbox() -> Iterator[Sandbox]:
    try:
        sb = Sandbox.create(template=TEMPLATE)
    except NotFoundError:
        pytest.skip(f"{TEMPLATE} is not built for this user")
    try:
        yield sb
    finally:
        try:
            sb.kill(delete_volume=True)
        except SandboxError:
            pass


def _rss() -> int:
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _peak_growth(fn: Callable[[], Any], seconds: float) -> tuple[Any, int]:
    """fn() within seconds, and how far this process's RSS rose above the start meanwhile."""
    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss() - base)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        value = _within(seconds, fn)
    finally:
        done.set()
        sampler.join()
    return value, peak[0]


# 5. kernel sockets: links planted where they were reach nothing on the host -------------
def test_kernel_socket_links_reach_no_host_socket(tag: str) -> None:
    with _code_sandbox() as sb, _host_listener(tag) as (path, srv):
        assert sb.run_code("40 + 2").text == "42"
        res = sb.commands.run(
            f"cd /.abx/run && for s in k*-[0-9]; do rm -f $s; ln -s '{path}' $s; done; "
            "ls /.abx/run; pkill -9 -f 'm ipykernel_launche[r]'; echo planted")
        assert res.stdout.endswith("planted\n"), res
        for _ in range(6):  # reconnect attempts would follow the links now
            _assert_never_connected(srv)
        execution = sb.run_code("6 * 7")
        assert execution.text == "42" and execution.kernel_restarted, execution
        _assert_never_connected(srv)


# 4 (kernels). a flood past the deadline ends on time, bounded --------------------------
def test_output_flood_ends_on_time_and_bounded() -> None:
    with _code_sandbox() as sb:
        flood = "s = 'x' * 100000\nwhile True:\n    print(s, flush=True)\n"
        execution, growth = _peak_growth(lambda: sb.run_code(flood, timeout=4), 60)
        assert isinstance(execution, Execution)
        assert execution.error is not None and execution.error.name == "TimeoutError"
        assert execution.truncated and len(execution.stdout) <= CELL_CAP
        assert growth < RSS_GROWTH, f"the host grew by {growth >> 20} MB"
        assert sb.run_code("1 + 1").text == "2"  # the next cell sees none of the flood


# the bridge itself replaced: its lines are hostile input --------------------------------
# A stand-in for the kernel's interpreter: as the kernel it sleeps (ignoring SIGINT); as
# the bridge it says it is ready, then does what /workspace/mode says.
_LIAR = r"""#!/bin/sh
case "$*" in *kernel_bridge.py*) ;; *) trap '' INT; while :; do sleep 1; done ;; esac
case "$(cat /workspace/mode)" in
silent) exec sleep 100000 ;;
stubborn) echo '{"t": "ready"}'; exec sleep 100000 ;;  # never reads: ignores close
esac
echo '{"t": "ready"}'
read -r request
case "$(cat /workspace/mode)" in
endless-line) cat /dev/zero ;;
endless-events)
  yes '{"id": 1, "t": "stream", "name": "stdout", "text": "'"$(head -c 60000 /dev/zero |
      tr '\0' y)"'"}' ;;
malformed)
  printf '%s\n' '[1, 2]' 'not json' '{"t": 5}' '{"id": 1, "t": "count", "n": "x"}' \
    '{"id": 1, "t": "result", "data": {"image/png": 5}}' \
    '{"id": 1, "t": "result", "data": [1]}' \
    '{"id": 1, "t": "stream", "name": 5, "text": 7}' \
    '{"id": 1, "t": "error", "ename": [1], "evalue": {}, "traceback": "x"}' \
    '{"id": 2, "t": "idle"}' '{"id": 1, "t": "stream", "name": "stdout", "text": "ok"}' \
    '{"id": 1, "t": "stream", "name": "stderr", "text": "a\ud800b"}'
  cat /workspace/deep.json
  echo '{"id": 1, "t": "idle"}'
  sleep 600 ;;
esac
"""


def _install_liar(sb: Sandbox, mode: str, restart: bool = True) -> None:
    sb.files.write("/workspace/liar", _LIAR)
    sb.files.write("/workspace/mode", mode)
    # A result nested past what any serializer takes, for the "malformed" mode.
    sb.files.write("/workspace/deep.json", '{"id": 1, "t": "result", "data": '
                   '{"application/json": ' + "[" * 300 + "]" * 300 + "}}\n")
    res = sb.commands.run("py=$(readlink -f /opt/abx-python/bin/python3); rm -f \"$py\"; "
                          "install -m 755 /workspace/liar \"$py\" && echo ok")
    assert res.stdout == "ok\n", res
    if restart:
        sb.restart_code_context()  # a new kernel and bridge: both the liar now
    else:  # the next run_code starts them
        sb.commands.run("pkill -9 -f 'm ipykernel_launche[r]'")


def test_lying_bridge_endless_line_is_bounded() -> None:
    _lying_flood("endless-line")


def test_lying_bridge_endless_events_are_bounded() -> None:
    _lying_flood("endless-events")


def _lying_flood(mode: str) -> None:
    with _code_sandbox() as sb:
        assert sb.run_code("1").text == "1"
        _install_liar(sb, mode)
        execution, growth = _peak_growth(lambda: sb.run_code("1", timeout=3), 60)
        assert execution.error is not None and execution.error.name == "TimeoutError"
        assert len(execution.stdout) <= CELL_CAP and execution.results == []
        assert growth < RSS_GROWTH, f"the host grew by {growth >> 20} MB"
        if mode == "endless-events":
            assert execution.truncated


def test_lying_bridge_malformed_events_are_skipped() -> None:
    with _code_sandbox() as sb:
        assert sb.run_code("1").text == "1"
        _install_liar(sb, "malformed")
        execution = _within(30, lambda: sb.run_code("1", timeout=20))
        assert isinstance(execution, Execution)
        assert execution.stdout == "ok" and execution.results == [], execution
        assert execution.stderr == "a\ufffdb"  # no lone surrogate reaches any client
        assert execution.execution_count is None and execution.truncated
        assert execution.error is not None and execution.error.name == ""
        execution.model_dump_json()  # the 300-deep result was dropped, not passed on


def test_stubborn_bridges_cost_no_host_thread() -> None:
    """Bridges that never read their stdin again: each restart still ends the last one
    from the host side (the guest kills it), so no host thread or socket is left."""
    def bridges() -> int:
        return sum(t.name == "kernel-bridge" for t in threading.enumerate())

    with _code_sandbox() as sb:
        assert sb.run_code("1").text == "1"
        before = bridges()
        _install_liar(sb, "stubborn")
        for _ in range(5):
            sb.restart_code_context()
        deadline = time.monotonic() + 10
        while bridges() > before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bridges() <= before, f"{bridges() - before} bridge threads left behind"


def test_silent_bridge_pins_a_short_cell_briefly() -> None:
    """A bridge that never says it is ready: a run_code with timeout=1 gives a clear
    error after the short start allowance, not after the minute a context start has."""
    with _code_sandbox() as sb:
        assert sb.run_code("1").text == "1"
        _install_liar(sb, "silent", restart=False)
        started = time.monotonic()
        with pytest.raises(SandboxError, match="did not start"):
            _within(40, lambda: sb.run_code("1", timeout=1))
        assert time.monotonic() - started < 40


# an account's context directory: links planted in it, or in its place, reach nothing ----
def test_links_in_or_for_an_accounts_kernel_dir_remove_nothing_on_the_host(
        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("kernel.json", "k-1", "keep"):
        (victim / name).write_text("host")
    with _code_sandbox() as sb:
        ctx = sb.create_code_context(user="user")
        # The account plants links to host paths in its own directory (its kernel does).
        plant = (
            "import os\n"
            "argv = open('/proc/self/cmdline', 'rb').read().decode().split(chr(0))\n"
            "d = os.path.dirname([a for a in argv if a.endswith('kernel.json')][0])\n"
            f"os.symlink('{victim}/keep', d + '/planted')\n"
            f"os.symlink('{victim}', d + '/dir-link')\n"
            "os.unlink(d + '/kernel.json')\n"
            f"os.symlink('{victim}/kernel.json', d + '/kernel.json')\n"
            "print(d)")
        r = sb.run_code(plant, context=ctx)
        assert r.error is None and r.stdout.startswith("/.abx/run/k"), r
        sb.restart_code_context(ctx)
        assert sorted(p.name for p in victim.iterdir()) == ["k-1", "keep", "kernel.json"]
        assert sb.run_code("import os; os.getuid()", context=ctx).text == "1000"
        # The sandbox's root puts a link where the directory was.
        swap = sb.commands.run(
            f"cd /.abx/run && for d in k*.d; do mv $d $d.old && ln -s '{victim}' $d; done; "
            "ls /.abx/run")
        assert swap.exit_code == 0 and ".d.old" in swap.stdout, swap
        sb.restart_code_context(ctx)
        assert sorted(p.name for p in victim.iterdir()) == ["k-1", "keep", "kernel.json"]
        assert all(p.read_text() == "host" for p in victim.iterdir())
        assert sb.run_code("import os; os.getuid()", context=ctx).text == "1000"
