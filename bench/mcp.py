"""MCP server throughput and latency, against targets and next to the previous figures.

    .venv/bin/python bench/mcp.py [--iterations 200] [--concurrency 200] [--sessions 4]
                                  [--repeat 3] [--server-root DIR] [--json]

Cases (HTTP ones with the official `mcp` client, one Client per session, unless said):
- STDIO: run_command "true" one after another (p50);
- HTTP: 24 concurrent `sleep 1` calls across 4 sessions (wall time: no hidden ceiling);
- HTTP: run_command "true" one after another (the per-call server CPU);
- HTTP: a burst of 200 concurrent run_command "true" across the sessions (p50/p99, errors,
  server CPU per call: /proc/PID/stat of the server process before and after), twice:
  * lean client (bench/_mcp_lean.py: raw JSON-RPC over keep-alive HTTP/1.1, in a process
    of its own): the figures held against the targets;
  * official client (in this process): it spends more CPU per call than the server, so on
    2 cores its p99 is mostly the client's; printed as a second row, for reference.
Bursts repeat (--repeat) and the median of each figure is printed. `--lean-only` runs only
the lean burst (a quick loop while profiling the server). `--server-root DIR` runs
the servers from another checkout (e.g. an export of an older commit) to measure it the same
way. Needs root + runc (real sandboxes); uses a private ABX_DATA_DIR it removes at exit.
Other processes on the machine skew every figure: the load average is printed with them.
"""

from __future__ import annotations

import os
import sys

# This file is named mcp.py: keep its directory from shadowing the `mcp` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)

import argparse  # noqa: E402
import atexit  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import httpx2 as httpx  # noqa: E402
from _common import fmt_ms, percentile, progress, table  # noqa: E402
from _mcp_http import cpu_ms, start_uvicorn, wait_children  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

ROOT = os.path.dirname(_HERE)
FIGURES = ("p50", "p99", "errors", "cpu", "wall", "client_cpu")
SLEEP_CALLS, SLEEP_SESSIONS = 24, 4

# figure -> (target, passes(value)); values in ms (errors: a count).
TARGETS: dict[str, tuple[str, Any]] = {
    "stdio_p50": ("<= 10 ms", lambda v: v <= 10),
    "sleep_wall": ("<= 1.5 s", lambda v: v <= 1500),
    # issue 34: 200 concurrent run_command true at p99 <= 150 ms, <= 0.8 ms server CPU each
    "burst_p99": ("<= 150 ms", lambda v: v <= 150),
    "burst_errors": ("0", lambda v: v == 0),
    "burst_cpu": ("<= 0.8 ms", lambda v: v <= 0.8),
}
for _key in ("p99", "errors", "cpu"):  # the lean client's burst is held to the same targets
    TARGETS[f"lean_{_key}"] = TARGETS[f"burst_{_key}"]
# Main at 7d1e996 (before issue 14: asyncio.to_thread's 6 threads, SSE answers, h11),
# measured with this file and --server-root on an export of that commit; medians of 3 runs
# on 2 cores shared with other work (load average 1.5-3.6).
PREVIOUS: dict[str, float] = {
    "stdio_p50": 6.31, "sleep_wall": 4190, "seq_p50": 13.1, "seq_cpu": 4.75,
    "burst_p50": 1286, "burst_p99": 1534, "burst_errors": 0, "burst_cpu": 3.9,
    "burst_wall": 1833, "burst_client_cpu": 4.2,
}


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)[:300]


async def bench_stdio(env: dict[str, str], cwd: str, iterations: int) -> dict[str, Any]:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "agent_sandbox.surfaces.mcp"], env=env, cwd=cwd)
    samples: list[float] = []
    errors: list[str] = []
    async with Client(params, mode="legacy") as client:
        await client.call_tool("run_command", {"command": "true"})  # default sandbox, warm-up
        for _ in range(iterations):
            start = time.perf_counter()
            r = await client.call_tool("run_command", {"command": "true"})
            samples.append((time.perf_counter() - start) * 1000)
            if r.is_error:
                errors.append(_text(r))
    return {"p50": percentile(samples, 50), "p99": percentile(samples, 99),
            "errors": len(errors), "first_error": errors[0] if errors else None}


async def _calls(clients: list[Client], n: int, args: dict[str, Any]
                 ) -> tuple[list[float], list[str], float]:
    """``n`` concurrent run_command calls spread over ``clients``: latencies, errors, wall."""
    samples: list[float] = []
    errors: list[str] = []

    async def one(client: Client) -> None:
        start = time.perf_counter()
        try:
            r = await client.call_tool("run_command", args)
            if r.is_error:
                errors.append(_text(r))
        except Exception as exc:  # noqa: BLE001 - counted, not fatal
            errors.append(f"{type(exc).__name__}: {exc}")
        samples.append((time.perf_counter() - start) * 1000)

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, clients[i % len(clients)])
    return samples, errors, (time.perf_counter() - began) * 1000


async def bench_http(url: str, pid: int, opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sessions = max(opts.sessions, SLEEP_SESSIONS)
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(
            timeout=120, limits=httpx.Limits(max_connections=opts.concurrency + 8)))
        clients = [await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=http), mode="legacy"))
            for _ in range(sessions)]
        for client in clients:  # each session's default sandbox, and a warm-up
            await client.call_tool("run_command", {"command": "true"})

        walls, first_error = [], None
        for _ in range(opts.repeat):
            _, errors, wall = await _calls(clients[:SLEEP_SESSIONS], SLEEP_CALLS,
                                           {"command": "sleep 1"})
            walls.append(wall)
            first_error = first_error or (errors[0] if errors else None)
        out["sleep_wall"] = statistics.median(walls)
        out["sleep_errors"] = first_error

        cpu = cpu_ms(pid)
        seq: list[float] = []
        for _ in range(opts.iterations):
            start = time.perf_counter()
            await clients[0].call_tool("run_command", {"command": "true"})
            seq.append((time.perf_counter() - start) * 1000)
        out["seq_p50"] = percentile(seq, 50)
        out["seq_cpu"] = (cpu_ms(pid) - cpu) / opts.iterations

        runs = []
        for _ in range(opts.repeat):
            cpu, mine = cpu_ms(pid), time.process_time()
            samples, errors, wall = await _calls(clients[:opts.sessions], opts.concurrency,
                                                 {"command": "true"})
            runs.append({"p50": percentile(samples, 50), "p99": percentile(samples, 99),
                         "errors": len(errors), "first": errors[0] if errors else None,
                         "cpu": (cpu_ms(pid) - cpu) / opts.concurrency, "wall": wall,
                         "client_cpu": (time.process_time() - mine) * 1000 / opts.concurrency})
        out.update(_medians("burst", runs))
    return out


def _medians(prefix: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {f"{prefix}_{key}": statistics.median(r[key] for r in runs) for key in FIGURES}
    out[f"{prefix}_first_error"] = next((r["first"] for r in runs if r["first"]), None)
    return out


def bench_lean(url: str, pid: int, opts: argparse.Namespace) -> dict[str, Any]:
    """The burst with the lean client, in a process of its own."""
    done = subprocess.run(
        [sys.executable, os.path.join(_HERE, "_mcp_lean.py"), url, str(pid),
         "--sessions", str(opts.sessions), "--concurrency", str(opts.concurrency),
         "--repeat", str(opts.repeat)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the lean client failed: {done.stderr[-2000:]}")
    runs = json.loads(done.stdout)["runs"]
    for r in runs:
        r["p50"], r["p99"] = percentile(r["samples"], 50), percentile(r["samples"], 99)
    out = _medians("lean", runs)
    out["lean_sys_cpu"] = statistics.median(r["sys_cpu"] for r in runs)
    return out


def _row(name: str, key: str, value: float, unit: str = "ms") -> list[str]:
    target, ok = TARGETS.get(key, ("", None))
    shown = fmt_ms(value) if unit == "ms" else f"{value:g}"
    before = PREVIOUS.get(key)
    was = "" if before is None else (fmt_ms(before) if unit == "ms" else f"{before:g}")
    verdict = "" if ok is None else ("ok" if ok(value) else "MISSED")
    return [name, shown, was, target, verdict]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--server-root", default=ROOT,
                    help="the checkout the servers run from (default: this one)")
    ap.add_argument("--skip-stdio", action="store_true")
    ap.add_argument("--lean-only", action="store_true",
                    help="only the lean client's burst (no STDIO, sleep or official cases)")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    root = os.path.abspath(opts.server_root)
    data_dir = tempfile.mkdtemp(prefix="abx-bench-mcp-", dir="/var/tmp")
    os.chmod(data_dir, 0o711)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "ABX_DATA_DIR": data_dir, "ABX_MCP_AUDIT_LOG": "", "PYTHONPATH": path,
           "ABX_MCP_TEMPLATE": "base",
           # The burst measures latency, not the busy limit.
           "ABX_MCP_MAX_CONCURRENCY": str(max(32, opts.concurrency + 8))}
    load = os.getloadavg()[0]
    results: dict[str, Any] = {"server_root": root}
    try:
        if not (opts.skip_stdio or opts.lean_only):
            progress(f"stdio: {opts.iterations} x run_command true")
            stdio = anyio.run(bench_stdio, env, root, opts.iterations)
            wait_children()
            results.update(stdio_p50=stdio["p50"], stdio_errors=stdio["first_error"])
        progress(f"http: {opts.concurrency} concurrent run_command true over {opts.sessions} "
                 "sessions (lean client)" + ("" if opts.lean_only else
                 f", then {SLEEP_CALLS} x sleep 1 over {SLEEP_SESSIONS} sessions, sequential "
                 "calls and the burst again with the official client"))
        proc, url = start_uvicorn(env, root)
        try:
            results.update(bench_lean(url, proc.pid, opts))
            if not opts.lean_only:
                results.update(anyio.run(bench_http, url, proc.pid, opts))
        finally:
            proc.terminate()
            proc.wait(60)
    finally:
        os.environ["ABX_DATA_DIR"] = data_dir
        from agent_sandbox.providers.local import local_provider

        engine = local_provider()
        for info in engine.list():
            engine.kill(info.sandbox_id, delete_volume=True)
        for vol in engine.list_volumes():
            engine.delete_volume(vol.volume_id)
        # Closed now, not at exit: its close releases host mounts, which remakes a lock
        # file in the data dir after we removed it.
        engine.close()
        atexit.unregister(engine.close)
        shutil.rmtree(data_dir, ignore_errors=True)
        time.sleep(2)  # a server's last engine close can remake that lock just after
        shutil.rmtree(data_dir, ignore_errors=True)
    results["load_before"], results["load_after"] = load, os.getloadavg()[0]
    if opts.json:
        print(json.dumps(results, indent=2))
        return 0
    rows = []
    if "stdio_p50" in results:
        rows.append(_row("stdio run_command true p50", "stdio_p50", results["stdio_p50"]))
    if "sleep_wall" in results:
        rows += [
            _row(f"http {SLEEP_CALLS} x sleep 1, {SLEEP_SESSIONS} sessions: wall", "sleep_wall",
                 results["sleep_wall"]),
            _row("http sequential p50", "seq_p50", results["seq_p50"]),
            _row("http sequential server CPU/call", "seq_cpu", results["seq_cpu"]),
        ]
    bursts = [("lean", "lean client, own process"), ("burst", "official client, this process")]
    for prefix, label in bursts:
        if f"{prefix}_p50" not in results:
            continue
        rows += [
            _row(f"http {opts.concurrency} concurrent, {opts.sessions} sessions, {label}: p50",
                 f"{prefix}_p50", results[f"{prefix}_p50"]),
            _row("  ... p99", f"{prefix}_p99", results[f"{prefix}_p99"]),
            _row("  ... errors", f"{prefix}_errors", results[f"{prefix}_errors"], unit="n"),
            _row("  ... server CPU/call", f"{prefix}_cpu", results[f"{prefix}_cpu"]),
            *([_row("  ... of which system (kernel) CPU", "lean_sys_cpu",
                    results["lean_sys_cpu"])] if prefix == "lean" else []),
            _row("  ... wall (all calls)", f"{prefix}_wall", results[f"{prefix}_wall"]),
            _row("  ... client CPU/call", f"{prefix}_client_cpu",
                 results[f"{prefix}_client_cpu"]),
        ]
    print(table(["case", "now", "before (7d1e996)", "target", ""], rows,
                title=f"MCP server ({root}; load average {load:.2f} -> "
                      f"{results['load_after']:.2f} on {os.cpu_count()} CPUs)"))
    # The event loop and the engine calls share one GIL: a burst cannot end sooner than
    # n x server CPU per call, nor sooner than the clients' CPU over the cores left.
    for prefix, label in bursts:
        if f"{prefix}_cpu" in results:
            n = opts.concurrency
            print(f"{label} burst floors: server {fmt_ms(n * results[f'{prefix}_cpu'])} "
                  f"(n x CPU/call, one core); client "
                  f"{fmt_ms(n * results[f'{prefix}_client_cpu'])} of CPU")
    for key in ("stdio_errors", "sleep_errors", "lean_first_error", "burst_first_error"):
        if results.get(key):
            print(f"{key}: {results[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
