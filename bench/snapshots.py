"""Memory snapshots (CRIU through runc): pause and resume of a sandbox holding 100 MB of
process memory, a snapshot of one with 100 MB of memory and 200 MB written, and 4 forks
of it started at once, running (their guests answer).

Run by hand, as root, from the repository root (needs CRIU >= 4.2: scripts/setup.sh)::

    .venv/bin/python bench/snapshots.py [--n 5] [--memory-mb 100] [--written-mb 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ms, median, percentile, progress, table  # noqa: E402
from _floor import bare_criu  # noqa: E402

from agent_sandbox import Sandbox  # noqa: E402
from agent_sandbox.backends.runc import criu  # noqa: E402

PAUSE_TARGET_MS = 300.0  # median, 100 MB of process memory
RESUME_TARGET_MS = 300.0
SNAPSHOT_TARGET_MS = 1000.0  # 100 MB of memory and 200 MB written
FORKS_TARGET_MS = 1500.0  # 4 forks running

HOLD = ("nohup python3 -c 'import time\nx=bytearray({mb}<<20)\n"
        "x[::4096]=b\"\\1\"*len(x[::4096])\ntime.sleep(1e6)' >/dev/null 2>&1 &")


def _holding(memory_mb: int) -> Sandbox:
    sb = Sandbox.create(timeout=3600, memory_mb=max(512, memory_mb * 3))
    sb.commands.run(HOLD.format(mb=memory_mb))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until its memory is touched
        rss = sb.commands.run("ps -o rss= -C python3 | sort -n | tail -1").stdout.strip()
        if rss and int(rss) >= memory_mb * 1000:
            return sb
        time.sleep(0.2)
    raise SystemExit("the memory holder did not start")


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--memory-mb", type=int, default=100)
    parser.add_argument("--written-mb", type=int, default=200)
    parser.add_argument("--forks", type=int, default=4)
    args = parser.parse_args()
    pauses, resumes, snaps, forks = [], [], [], []
    sb = _holding(args.memory_mb)
    try:
        progress(f"pause / resume x{args.n} ...")
        for _ in range(args.n):
            start = time.perf_counter()
            sb.pause()
            pauses.append(_ms(start))
            start = time.perf_counter()
            sb.resume()
            sb.commands.run("true")  # resumed = its guest answers
            resumes.append(_ms(start))
        sb.commands.run(f"head -c {args.written_mb << 20} /dev/urandom > /workspace/w.bin")
        progress(f"snapshot and {args.forks} forks x{args.n} ...")
        for _ in range(args.n):
            start = time.perf_counter()
            snap = sb.snapshot()
            snaps.append(_ms(start))
            start = time.perf_counter()
            with ThreadPoolExecutor(args.forks) as pool:
                made = list(pool.map(lambda sid: Sandbox.create(snapshot=sid),
                                     [snap.snapshot_id] * args.forks))
            forks.append(_ms(start))
            for fork in made:
                fork.kill()
            Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        sb.kill()
    progress(f"floor: bare criu dump / restore of a process holding {args.memory_mb} MB ...")
    found = criu.find()
    floor = bare_criu(found.path, args.memory_mb, args.n) if found.ok else \
        {"skipped": found.problem}
    rows = [
        [f"pause, {args.memory_mb} MB of memory", pauses, PAUSE_TARGET_MS],
        [f"resume, {args.memory_mb} MB of memory", resumes, RESUME_TARGET_MS],
        [f"snapshot, {args.memory_mb} MB memory + {args.written_mb} MB written", snaps,
         SNAPSHOT_TARGET_MS],
        [f"{args.forks} forks running", forks, FORKS_TARGET_MS],
    ]
    print(table(["measure", "p50", "p95", "target (p50)"], [
        [name, fmt_ms(median(v)), fmt_ms(percentile(v, 95)), f"<= {target:g} ms"]
        for name, v, target in rows], title=f"memory snapshots (CRIU, n={args.n})"))
    if "skipped" in floor:
        print(f"floor: skipped ({floor['skipped']})")
    else:
        print(f"floor, same run: bare criu dump {fmt_ms(floor['dump']['p50'])}, restore "
              f"{fmt_ms(floor['restore']['p50'])} (p50; a host process, no container)")


if __name__ == "__main__":
    main()
