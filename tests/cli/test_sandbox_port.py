"""``abx sandbox port SBX PORT``: prints the address, forwards until Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


def test_port_prints_the_address_and_forwards_until_ctrl_c(abx) -> None:  # noqa: ANN001
    sb = Sandbox.create()
    try:
        sb.files.write("/tmp/web/index.html", "via the cli\n")
        sb.commands.run("cd /tmp/web && exec python3 -m http.server 8000 --bind 127.0.0.1",
                        background=True)
        proc = subprocess.Popen([*abx.command, "sandbox", "port", sb.sandbox_id, "8000"],
                                cwd=abx.cwd, env=abx.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()  # "SBX port 8000: http://127.0.0.1:N"
            assert line.startswith(f"{sb.sandbox_id} port 8000: http://127.0.0.1:"), \
                (line, proc.stderr.read())
            where = line.rsplit("http://", 1)[1]
            deadline = time.monotonic() + 20
            while True:
                try:
                    body = urllib.request.urlopen(f"http://{where}/index.html", timeout=5).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert body == b"via the cli\n"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(20) == 0
            with pytest.raises(OSError):  # the forwarder went with the process
                urllib.request.urlopen(f"http://{where}/", timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        sb.kill(delete_volume=True)
