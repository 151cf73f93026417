"""What a forwarded port costs: a raw TCP echo server inside a sandbox (network off),
reached from the host through the guest channel (``Sandbox.expose_port``): connection
setup + one round trip, a round trip on an open connection, and a 100 MB transfer each way.

Run by hand, as root, from the repository root::

    .venv/bin/python bench/ports.py [--n 200] [--mb 100]
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import fmt_ms, median, percentile, progress, table  # noqa: E402
from portservers import ECHO  # noqa: E402

from agent_sandbox import Sandbox  # noqa: E402

SETUP_TARGET_MS = 5.0  # a new forwarded connection, first byte back (p50)
RTT_TARGET_MS = 0.5  # a round trip on an open one (p50)
RATE_TARGET = 200.0  # MB/s each way


def _round_trip(sock: socket.socket, data: bytes = b"x") -> None:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        got += sock.recv(65536)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    with Sandbox.create() as sb:
        sb.files.write("/tmp/echo.py", ECHO)
        sb.commands.run("python3 /tmp/echo.py", background=True)
        host, port = sb.get_host(9001).split(":")
        address = (host, int(port))
        for _ in range(100):
            try:
                with socket.create_connection(address, 2) as s:
                    _round_trip(s)
                break
            except OSError:
                time.sleep(0.1)
        progress(f"connection setup x{args.n} ...")
        setups = []
        for _ in range(args.n):
            start = time.perf_counter()
            with socket.create_connection(address, 10) as s:
                _round_trip(s)
            setups.append((time.perf_counter() - start) * 1000)
        progress(f"round trips x{args.n} ...")
        rtts = []
        with socket.create_connection(address, 10) as s:
            for _ in range(args.n):
                start = time.perf_counter()
                _round_trip(s)
                rtts.append((time.perf_counter() - start) * 1000)
        progress(f"{args.mb} MB through the echo ...")
        blob = b"\0" * (1 << 20)
        with socket.create_connection(address, 30) as s:
            start = time.perf_counter()
            sender = threading.Thread(target=lambda: [s.sendall(blob) for _ in range(args.mb)])
            sender.start()
            got = 0
            while got < args.mb << 20:
                got += len(s.recv(1 << 20))
            sender.join()
            seconds = time.perf_counter() - start
    rate = args.mb * 1.048576 / seconds
    print(table(["measure", "p50", "p99", "target"], [
        ["new connection + first round trip", fmt_ms(median(setups)),
         fmt_ms(percentile(setups, 99)), f"<= {SETUP_TARGET_MS:g} ms"],
        ["round trip, open connection", fmt_ms(median(rtts)), fmt_ms(percentile(rtts, 99)),
         f"<= {RTT_TARGET_MS:g} ms"],
        [f"{args.mb} MB each way at once", f"{rate:.0f} MB/s", "-", f">= {RATE_TARGET:g} MB/s"],
    ], title=f"forwarded port (embedded engine, network off, n={args.n})"))


if __name__ == "__main__":
    main()
