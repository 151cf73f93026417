"""What `abx mcp start` (the command every installed MCP client config runs) costs before the
STDIO server starts: spawn to the first byte of the `initialize` answer, for the server run
directly and through the launcher.

    .venv/bin/python bench/mcp_launch.py [--runs 15] [--json]

Target: the launcher adds <= 100 ms over `python -m agent_sandbox.surfaces.mcp` (it execs the
server after one interpreter start and standard-library imports; the full CLI, typer/rich/
pydantic, added ~350 ms). Touches no engine: each run gets a private HOME, runtime dir and
ABX_DATA_DIR (never created: `initialize` needs no sandbox), removed at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from _common import fmt_ms, percentile, progress, table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_OVERHEAD_MS = 100.0
INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"}}}) + "\n"


def first_byte_ms(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin and proc.stdout
    try:
        proc.stdin.write(INIT.encode())
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready or not os.read(proc.stdout.fileno(), 1):
            raise RuntimeError(f"{' '.join(argv)}: no answer to initialize")
        return (time.perf_counter() - start) * 1000
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    abx = Path(sys.executable).parent / "abx"
    commands = {
        "server (python -m agent_sandbox.surfaces.mcp)": [sys.executable, "-m",
                                                        "agent_sandbox.surfaces.mcp"],
        "abx mcp start": [str(abx), "mcp", "start"],
        "python -m agent_sandbox.surfaces.cli mcp start": [
            sys.executable, "-m", "agent_sandbox.surfaces.cli", "mcp", "start"],
    }
    if not abx.exists():
        del commands["abx mcp start"]
    tmp = tempfile.mkdtemp(prefix="abx-bench-launch-")
    try:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "ABX_MCP_RUNTIME_DIR": str(Path(tmp) / "run"),
               "ABX_DATA_DIR": str(Path(tmp) / "data"), "ABX_MCP_AUDIT_LOG": "",
               "ABX_MCP_TEMPLATE": "base", "PYTHONPATH": ROOT}
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for i in range(args.runs):
            progress(f"run {i + 1}/{args.runs}")
            for name, argv in commands.items():  # interleaved: load drifts hit each alike
                samples[name].append(first_byte_ms(argv, env, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    direct = percentile(next(iter(samples.values())), 50)
    result = {name: {"p50": percentile(s, 50), "min": min(s), "max": max(s),
                     "overhead_p50": percentile(s, 50) - direct} for name, s in samples.items()}
    if args.json:
        print(json.dumps({"runs": args.runs, "target_overhead_ms": TARGET_OVERHEAD_MS,
                          "results": result}, indent=2))
        return 0
    rows = [[name, fmt_ms(r["p50"]), fmt_ms(r["min"]), fmt_ms(r["max"]),
             "-" if r is result[next(iter(result))] else fmt_ms(r["overhead_p50"]),
             "-" if r is result[next(iter(result))] else f"<= {TARGET_OVERHEAD_MS:.0f} ms"]
            for name, r in result.items()]
    print(table(["spawn -> first byte of initialize", "p50", "min", "max", "launcher adds",
                 "target"], rows, title=f"MCP STDIO start ({args.runs} runs)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
