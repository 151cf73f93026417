"""The guest agent's start, from exec to its first answer, for this tree's guest and
another revision's, run alternately so load on a shared host moves both alike.

Run by hand from the repository root (root or not; no sandbox is made)::

    .venv/bin/python bench/guest_start.py [--against main] [--runs 60]

Each run starts pid 1's command line (the host's ``/usr/bin/python3 -I -S -X utf8``,
bytecode precompiled as the engine's stage has it) on the host with a listener on fd 3,
as ``runc run`` hands it over, and times until a ping is answered: the guest's share of a
cold create without runc's. A bare ``python3 -I -S -c pass`` is timed alongside as the
floor of any Python pid 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from _common import fmt_ms, fmt_ratio, median, progress, summary, table
from _revision import GUEST, GUEST_PYTHON, ROOT, export_guest, precompiled

PYTHON = GUEST_PYTHON


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", default="main", help="git revision to compare with (main)")
    p.add_argument("--runs", type=int, default=60)
    return p.parse_args(argv)


def first_answer(guest_dir: Path, where: Path) -> float:
    """Milliseconds from spawning the guest to its answer to a ping."""
    sys.path.insert(0, str(ROOT))
    from agent_sandbox.guestlink.client import GuestClient

    path = str(where / "guest.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    boot = f"import sys; sys.path.insert(0, {str(guest_dir)!r}); import agent; agent.main()"
    null = os.open(os.devnull, os.O_RDWR)
    start = time.perf_counter()
    pid = os.posix_spawn(PYTHON, [PYTHON, "-I", "-S", "-X", "utf8", "-c", boot,
                                  "--listen-fd", "3"], {"LC_ALL": "C"},
                         file_actions=[(os.POSIX_SPAWN_DUP2, null, 0),
                                       (os.POSIX_SPAWN_DUP2, null, 1),
                                       (os.POSIX_SPAWN_DUP2, listener.fileno(), 3)])
    os.close(null)
    try:
        GuestClient(path, connect_timeout=5.0).ping_within(10.0)
        return (time.perf_counter() - start) * 1000
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        listener.close()
        os.unlink(path)


def bare_python() -> float:
    start = time.perf_counter()
    pid = os.posix_spawn(PYTHON, [PYTHON, "-I", "-S", "-X", "utf8", "-c", "pass"], {})
    os.waitpid(pid, 0)
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="abx-guest-start-") as tmp:
        before = export_guest(args.against, Path(tmp) / "before")
        after = precompiled(ROOT / GUEST)
        samples: dict[str, list[float]] = {"before": [], "after": [], "python": []}
        for i in range(args.runs + 3):
            b, a, py = first_answer(before, Path(tmp)), first_answer(after, Path(tmp)), \
                bare_python()
            if i >= 3:  # warm-up: page cache, bytecode
                samples["before"].append(b)
                samples["after"].append(a)
                samples["python"].append(py)
        progress(f"{args.runs} paired runs")
    stats = {k: summary(v) for k, v in samples.items()}
    rows = [[f"guest of {args.against}: exec to first answer", fmt_ms(stats["before"]["p50"]),
             fmt_ms(stats["before"]["p95"])],
            ["guest of this tree: exec to first answer", fmt_ms(stats["after"]["p50"]),
             fmt_ms(stats["after"]["p95"])],
            ["floor: python3 -I -S -c pass", fmt_ms(stats["python"]["p50"]),
             fmt_ms(stats["python"]["p95"])]]
    print(table(["figure", "p50", "p95"], rows, title="guest start (paired runs)"))
    floor = stats["python"]["p50"]
    ratio = median(samples["after"]) / median(samples["before"])
    print(f"\nthis tree / {args.against}: {fmt_ratio(ratio)}; over the python floor: "
          f"{fmt_ms(stats['before']['p50'] - floor)} -> "
          f"{fmt_ms(stats['after']['p50'] - floor)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
