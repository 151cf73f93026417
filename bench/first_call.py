"""A new ordinary user's first tool call over STDIO, with the host's shared template.

Run by hand, as root, from the repository root::

    .venv/bin/python bench/first_call.py [--runs 3] [--pool-size N] [--json]

Builds (or finds) the shared ``code-interpreter-v1`` first, as root. Each run makes a
fresh user (useradd, removed at the end), spawns ``python -m agent_sandbox.surfaces.mcp`` as
that user, and speaks JSON-RPC lines to it: ``initialize``, then at once ``tools/call
run_command``, as an IDE does. It prints the time from spawn to the ``initialize`` answer,
the first call's own latency (sent to answered), the total from spawn, and the user's
data dir afterwards (no copy of the template: only base and the mirror of its
directories). ``--offline`` instead points the user at no shared template and an
unreachable index, and times a first ``run_code`` (the error naming the fix) and a first
``run_command`` (on base).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import fmt_ms, median, progress, table

REPO = Path(__file__).resolve().parent.parent
TARGET_FIRST_CALL_S = 3.0
TARGET_OFFLINE_RUN_CODE_S = 3.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="fresh users, one first call each")
    p.add_argument("--pool-size", type=int, default=None,
                   help="ABX_POOL_SIZE for the server (default: the server's own, 2)")
    p.add_argument("--offline", action="store_true",
                   help="no shared template, index unreachable: time run_code's error")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p.parse_args(argv)


class Lines:
    """JSON-RPC lines to and from a server process."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.buf = b""

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 300) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no answer from the server")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the server closed its stdout")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


def _call(n: int, tool: str, **args: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}


def one_run(user: Any, env: dict[str, str], tool: str, args: dict[str, Any]
            ) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.Popen(user.argv([sys.executable, "-m", "agent_sandbox.surfaces.mcp"]),
                            env=env, cwd=str(user.home), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wire = Lines(proc)
    try:
        wire.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "bench", "version": "1"}}})
        wire.recv()
        initialized = time.monotonic()
        wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        wire.send(_call(2, tool, **args))
        reply = wire.recv()
        answered = time.monotonic()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    result = reply.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    return {"initialize_s": initialized - started, "call_s": answered - initialized,
            "total_s": answered - started, "is_error": bool(result.get("isError")),
            "text": text[:400]}


def data_dir_report(user: Any) -> dict[str, Any]:
    templates = user.home / ".local" / "share" / "agent-sandbox" / "templates"
    out: dict[str, Any] = {}
    for entry in sorted(templates.iterdir()) if templates.is_dir() else []:
        if entry.name.startswith("."):
            continue
        size = subprocess.run(["du", "-sb", str(entry)], capture_output=True, text=True)
        out[entry.name] = int(size.stdout.split()[0]) if size.returncode == 0 else None
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench/first_call.py: run as root (it makes users)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "tests"))
    from localusers import LocalUsers  # the test suite's real-user helper

    from agent_sandbox.backends.runc.host import subids
    from agent_sandbox.backends.runc.templates import code_interpreter as code_template
    from agent_sandbox.config.engine import EngineConfig

    base_env: dict[str, str] = {"ABX_MCP_AUDIT_LOG": ""}
    if os.environ.get("PYTHONPATH"):
        base_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    if args.pool_size is not None:
        base_env["ABX_POOL_SIZE"] = str(args.pool_size)
    if args.offline:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple"
        base_env.update(ABX_SHARED_TEMPLATES_DIR="/var/tmp/abx-bench-no-shared-templates",
                        ABX_TEMPLATE_INDEX_URL=url)
        tool, tool_args = "run_code", {"code": "1 + 1"}
    else:
        progress("shared code-interpreter-v1: building or checking (as root)")
        code_template.ensure(code_template.store_for(EngineConfig()))
        tool, tool_args = "run_command", {"command": "echo $VIRTUAL_ENV"}
    subids.reserve()
    users = LocalUsers()
    runs: list[dict[str, Any]] = []
    try:
        for index in range(args.runs):
            user = users.create()
            progress(f"run {index + 1}/{args.runs}: new user {user.name}, first {tool}")
            run = one_run(user, user.env(**base_env), tool, tool_args)
            if args.offline:  # and the same user's first run_command, on base
                again = one_run(user, user.env(**base_env), "run_command",
                                {"command": "echo hi"})
                run["run_command_call_s"] = again["call_s"]
                run["run_command_ok"] = not again["is_error"]
            run["data_dir"] = data_dir_report(user)
            runs.append(run)
            cleanup = ("from agent_sandbox.providers.local import local_provider\n"
                       "e = local_provider()\n"
                       "[e.kill(i.sandbox_id, delete_volume=True) for i in e.list()]")
            user.run([sys.executable, "-c", cleanup], env=user.env(**base_env), timeout=120)
    finally:
        users.cleanup()
    call = median([r["call_s"] for r in runs])
    total = median([r["total_s"] for r in runs])
    result = {"tool": tool, "runs": runs, "median_call_s": call, "median_total_s": total,
              "pool_size": args.pool_size, "offline": args.offline}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    target = TARGET_OFFLINE_RUN_CODE_S if args.offline else TARGET_FIRST_CALL_S
    rows = [[f"first {tool}: call (sent -> answered), median", fmt_ms(call * 1000),
             f"<= {target:.0f} s"],
            ["first call from spawn (initialize included), median", fmt_ms(total * 1000), ""],
            ["initialize from spawn, median",
             fmt_ms(median([r["initialize_s"] for r in runs]) * 1000), ""]]
    if args.offline:
        rows.append(["then run_command on base: call, median",
                     fmt_ms(median([r["run_command_call_s"] for r in runs]) * 1000), ""])
    print(table(["figure", "measured", "target"], rows))
    for r in runs:
        print(f"  error={r['is_error']} data dir templates (bytes): {r['data_dir']}"
              f"{'  ' + r['text'][:160] if r['is_error'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
