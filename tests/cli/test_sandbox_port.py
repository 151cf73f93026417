"""``abx sandbox port SBX PORT``: prints the address, forwards until Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


@contextmanager
def _serving() -> Iterator[Sandbox]:
    sb = Sandbox.create()
    try:
        sb.files.write("/tmp/web/index.html", "via the cli\n")
        sb.commands.run("cd /tmp/web && exec python3 -m http.server 8000 --bind 127.0.0.1",
                        background=True)
        yield sb
    finally:
        sb.kill(delete_volume=True)


@contextmanager
def _port_cli(abx, sb: Sandbox) -> Iterator[tuple[subprocess.Popen[str], str]]:  # noqa: ANN001
    """The running ``abx sandbox port SBX 8000`` and the address it forwards from. Its
    stderr goes to a file: a pipe nobody reads could block it once full."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*abx.command, "sandbox", "port", sb.sandbox_id, "8000"],
                                cwd=abx.cwd, env=abx.env, stdout=subprocess.PIPE, stderr=err,
                                text=True, stdin=subprocess.DEVNULL,
                                # Started as a script's background job (or a CI runner)
                                # starts it: SIGINT ignored. Ctrl-C must stop it anyway.
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()  # "SBX port 8000: http://127.0.0.1:N"
            assert line.startswith(f"{sb.sandbox_id} port 8000: http://127.0.0.1:"), \
                (line, err.seek(0), err.read())
            where = line.rsplit("http://", 1)[1]
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://{where}/index.html", timeout=5) as r:
                        body = r.read()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert body == b"via the cli\n"
            yield proc, where
        except BaseException:
            err.seek(0)
            print("abx sandbox port's stderr:", err.read()[-4000:], file=sys.stderr)
            raise
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_port_prints_the_address_and_forwards_until_ctrl_c(abx) -> None:  # noqa: ANN001
    with _serving() as sb, _port_cli(abx, sb) as (proc, where):
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        with pytest.raises(OSError):  # the forwarder went with the process
            urllib.request.urlopen(f"http://{where}/", timeout=5)


def test_sigterm_stops_it_as_ctrl_c_does(abx) -> None:  # noqa: ANN001
    with _serving() as sb, _port_cli(abx, sb) as (proc, where):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_ctrl_c_does_not_wait_for_another_process_using_the_views(abx) -> None:  # noqa: ANN001
    """At exit the engine releases the template views if no sandbox is left, under their
    lock: while another process held it (creating or ending a sandbox), Ctrl-C waited
    as long as that process did (over 20 s in full test runs)."""
    from agent_sandbox.config.engine import EngineConfig
    from agent_sandbox.config.settings import Settings

    lock = EngineConfig.from_settings(Settings()).idmap_dir / ".lock"
    with _serving() as sb, _port_cli(abx, sb) as (proc, _):
        # Taken once the views are up (a create waits for them, rightly).
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, time\n"
             f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
             "print('held', flush=True); time.sleep(600)"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == 0  # the holder keeps the lock for 10 minutes
        finally:
            holder.kill()
            holder.wait()
