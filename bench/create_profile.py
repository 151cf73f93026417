"""Where a cold create's time goes: each step of ``Sandbox.create()`` on the runc engine
timed on its own, next to the floor (a bare ``runc run`` of a no-op) measured in the
same run, one floor run between two creates, so load on a shared host moves both alike.

Run by hand, as root, from the repository root::

    .venv/bin/python bench/create_profile.py [--iterations 40] [--against REV] [--json]

With ``--against REV`` every iteration makes one sandbox with REV's guest agent and one
with this tree's, in the same engine process (the engine stages whichever guest code it
is given): a paired before/after of a guest change.

The steps are timed by wrapping the engine's own functions (nothing is changed in how
they run); the guest's share is split further by timing the guest's interpreter start
and its imports on the host (``python3 -X importtime``), which is what pid 1 does before
it answers. A private data dir under /var/tmp is used and removed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import fmt_ms, fmt_ratio, median, progress, summary, table
from _floor import bare_runc_run
from _revision import ROOT, export_guest

# (label, module, attribute path): the steps of a create, outermost first.
STEPS = [
    ("create (total)", "agent_sandbox.service.service", "SandboxService.create"),
    ("  make (lock, row, volume, boot)", "agent_sandbox.backends.runc.sandboxes",
     "Sandboxes.make"),
    ("    new volume (image, fallocate)", "agent_sandbox.backends.runc.host.root",
     "RootHost.new_volume"),
    ("    boot", "agent_sandbox.backends.runc.boot", "Booter.boot"),
    ("      supervisor check", "agent_sandbox.backends.runc.supervisor", "ensure_running"),
    ("      attach disk (loop mount)", "agent_sandbox.backends.runc.host.root",
     "RootHost.attach"),
    ("      stage (guest code, shared files)", "agent_sandbox.backends.runc.host.root",
     "RootHost.shared_files"),
    ("      config.json", "agent_sandbox.backends.runc.boot", "build_config"),
    ("      root filesystem (overlays, run tmpfs)", "agent_sandbox.backends.runc.host.root",
     "RootHost.bundle"),
    ("      runc run --detach", "agent_sandbox.backends.runc.runc", "Runc.run_detached"),
    ("      guest's first answer", "agent_sandbox.backends.runc.boot", "Booter.wait_ready"),
    ("  state writes (rows)", "agent_sandbox.backends.runc.store", "Store.update_sandbox"),
    ("  row insert", "agent_sandbox.backends.runc.store", "Store.insert_sandbox"),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--against", default=None,
                   help="git revision whose guest agent is timed alternately with this one")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def wrap_steps(samples: dict[str, dict[str, list[float]]], current: list[str]) -> None:
    """Time each step into ``samples[current[0]][label]``."""
    import importlib

    for label, module_name, attr in STEPS:
        module = importlib.import_module(module_name)
        owner: Any = module
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def timed(*a: Any, __f: Any = original, __label: str = label, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return __f(*a, **kw)
            finally:
                samples[current[0]][__label].append((time.perf_counter() - start) * 1000)

        setattr(owner, name, functools.wraps(original)(timed))


def guest_startup(runs: int = 10) -> dict[str, float]:
    """The guest's interpreter start and its imports, on the host's /usr/bin/python3 as
    pid 1 runs them (``-I -S``), medians in ms."""
    from agent_sandbox.guest import SOURCE_DIR

    bare: list[float] = []
    imports: list[float] = []
    code = f"import sys; sys.path.insert(0, {str(SOURCE_DIR)!r}); import server"
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", "pass"], check=True)
        bare.append((time.perf_counter() - start) * 1000)
        proc = subprocess.run(["/usr/bin/python3", "-I", "-S", "-X", "importtime", "-c", code],
                              capture_output=True, text=True, check=True)
        total = 0
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
            if m and not m.group(2).startswith(" "):  # top-level imports only
                total += int(m.group(1))
        imports.append(total / 1000)
    return {"python_start": median(bare), "guest_imports": median(imports)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_dir = Path(tempfile.mkdtemp(prefix="abx-prof-", dir="/var/tmp"))
    os.chmod(data_dir, 0o711)
    os.environ["ABX_DATA_DIR"] = str(data_dir)
    os.environ["ABX_POOL_SIZE"] = "0"
    sys.path.insert(0, str(ROOT))
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    floor: list[float] = []
    current = ["this tree"]
    engine = None
    try:
        from agent_sandbox import Sandbox
        from agent_sandbox.backends.runc import boot
        from agent_sandbox.providers.local import local_provider

        guests = {"this tree": boot.SOURCE_DIR}
        if args.against:
            guests = {args.against: export_guest(args.against, data_dir / "against"),
                      **guests}
        engine = local_provider()
        progress("warm-up: 2 creates of each guest")
        for source in [*guests.values()] * 2:
            boot.SOURCE_DIR = source
            sb = Sandbox.create()
            sb.commands.run("true")
            sb.kill(delete_volume=True)
        wrap_steps(samples, current)
        for i in range(args.iterations):
            one = bare_runc_run(1, warmup=0)
            floor.append(one.get("p50", float("nan")))
            for name, source in guests.items():
                current[0], boot.SOURCE_DIR = name, source
                sb = Sandbox.create()
                start = time.perf_counter()
                sb.commands.run("true")
                samples[name]["first exec after create"].append(
                    (time.perf_counter() - start) * 1000)
                sb.kill(delete_volume=True)
            if (i + 1) % 10 == 0:
                progress(f"{i + 1}/{args.iterations}")
        guest = guest_startup()
    finally:
        if engine is not None:
            from agent_sandbox.backends.runc import supervisor

            for info in engine.list():
                engine.kill(info.sandbox_id, delete_volume=True)
            engine.close()
            engine.backend.release_host_mounts()
            supervisor.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
    labels = [label for label, _, _ in STEPS] + ["first exec after create"]
    result: dict[str, Any] = {
        "steps": {name: {label: summary(got[label]) for label in labels}
                  for name, got in samples.items()},
        "floor_runc_run": summary(floor), "guest_startup": guest}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    names = list(samples)
    totals = {name: median(samples[name]["create (total)"]) for name in names}
    rows = []
    for label in labels:
        row = [label]
        for name in names:
            value = median(samples[name][label])
            share = f" ({100 * value / totals[name]:.0f}%)" if label in dict(
                (x[0], 1) for x in STEPS) else ""
            row.append(fmt_ms(value) + share)
        rows.append(row)
    blank = [""] * (len(names) - 1)
    rows.append(["guest: python3 -I -S start (host)", fmt_ms(guest["python_start"]), *blank])
    rows.append(["guest: its imports (host, importtime)", fmt_ms(guest["guest_imports"]),
                 *blank])
    rows.append(["floor: bare runc run (busybox true)", fmt_ms(median(floor)), *blank])
    print(table(["step (median of each; share of create)", *names], rows,
                title="where a cold create's time goes"))
    for name in names:
        print(f"create / floor (p50 / p50, same run), {name}: "
              f"{fmt_ratio(totals[name] / median(floor))}")
    if len(names) == 2:
        print(f"{names[1]} / {names[0]}: create {fmt_ratio(totals[names[1]] / totals[names[0]])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
