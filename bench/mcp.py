"""MCP server latency: run_command "true" over STDIO, and concurrent tool calls over HTTP.

    .venv/bin/python bench/mcp.py [--iterations 200] [--concurrency 200] [--json]

Targets: STDIO p50 <= 10 ms; 200 concurrent HTTP calls p99 <= 150 ms with no errors. The
HTTP rows also give the server process's CPU per call: a burst of N cannot finish sooner than
N x that / the cores it can use.
Needs root + runc (it runs real sandboxes). Uses a private ABX_DATA_DIR it removes at exit.
"""

from __future__ import annotations

import os
import sys

# This file is named mcp.py: keep its directory from shadowing the `mcp` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import httpx2 as httpx  # noqa: E402
from _common import fmt_ms, percentile, progress, table  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

ROOT = os.path.dirname(_HERE)


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)[:300]


def _summary(samples: list[float], errors: list[str]) -> dict[str, Any]:
    """Percentiles, the error count and the first error's text (to say why, not only how
    many)."""
    return {"n": len(samples), "p50": percentile(samples, 50), "p99": percentile(samples, 99),
            "errors": len(errors), "first_error": errors[0] if errors else None}


async def bench_stdio(env: dict[str, str], iterations: int) -> dict[str, Any]:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "agent_sandbox.agent.mcp"], env=env, cwd=ROOT)
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
    return _summary(samples, errors)


def _cpu_ms(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def bench_http(url: str, server_pid: int, sequential: int,
                     concurrency: int) -> dict[str, dict[str, Any]]:
    """Sequential calls (the per-call cost), then a burst of concurrent ones, with the
    server's CPU per call: the burst's p99 cannot beat burst size x CPU per call / cores."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)
                                 ) as http, \
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        await client.call_tool("run_command", {"command": "true"})  # default sandbox, warm-up

        async def one(samples: list[float], errors: list[str]) -> None:
            start = time.perf_counter()
            try:
                r = await client.call_tool("run_command", {"command": "true"})
                if r.is_error:
                    errors.append(_text(r))
            except Exception as exc:  # noqa: BLE001 - counted, not fatal
                errors.append(f"{type(exc).__name__}: {exc}")
            samples.append((time.perf_counter() - start) * 1000)

        results = {}
        for name, n, parallel in (("http_sequential", sequential, False),
                                  ("http_concurrent", concurrency, True)):
            samples: list[float] = []
            errors: list[str] = []
            cpu = _cpu_ms(server_pid)
            if parallel:
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(one, samples, errors)
            else:
                for _ in range(n):
                    await one(samples, errors)
            results[name] = {**_summary(samples, errors),
                             "server_cpu_ms_per_call": (_cpu_ms(server_pid) - cpu) / n}
    return results


def start_uvicorn(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agent_sandbox.agent.mcp_http:asgi_app", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(base + "/health", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    return proc, base + "/mcp"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="abx-bench-mcp-", dir="/var/tmp")
    os.chmod(data_dir, 0o711)
    env = {**os.environ, "ABX_DATA_DIR": data_dir, "ABX_MCP_AUDIT_LOG": "",
           # The concurrency test measures latency, not the busy limit.
           "ABX_MCP_MAX_CONCURRENCY": str(max(32, opts.concurrency + 8))}
    try:
        progress(f"stdio: {opts.iterations} x run_command true")
        stdio = anyio.run(bench_stdio, env, opts.iterations)
        progress(f"http: {opts.concurrency} concurrent run_command true")
        proc, url = start_uvicorn(env)
        try:
            http = anyio.run(bench_http, url, proc.pid, opts.iterations, opts.concurrency)
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
        engine.release_host_mounts()
        shutil.rmtree(data_dir, ignore_errors=True)
    results = {"stdio_run_command": stdio, **http}
    if opts.json:
        print(json.dumps(results, indent=2))
    else:
        seq, burst = http["http_sequential"], http["http_concurrent"]
        rows = [["stdio run_command true", stdio["n"], fmt_ms(stdio["p50"]), fmt_ms(stdio["p99"]),
                 stdio["errors"], "", "p50 <= 10 ms"],
                ["http sequential", seq["n"], fmt_ms(seq["p50"]), fmt_ms(seq["p99"]),
                 seq["errors"], fmt_ms(seq["server_cpu_ms_per_call"]), ""],
                [f"http {burst['n']} concurrent", burst["n"], fmt_ms(burst["p50"]),
                 fmt_ms(burst["p99"]), burst["errors"], fmt_ms(burst["server_cpu_ms_per_call"]),
                 "p99 <= 150 ms"]]
        print(table(["case", "n", "p50", "p99", "errors", "server CPU/call", "target"], rows,
                    title="MCP server"))
        for name, res in results.items():
            if res["first_error"]:
                print(f"{name}: first error: {res['first_error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
