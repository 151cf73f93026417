"""E2B's Python SDK (``e2b``, unmodified, pointed at a loopback gateway by environment
variables) next to our own SDK through the same gateway and on the embedded engine:
create -> first command (``echo hi``), one ``commands.run`` round trip, and a 10 MB
``files.write`` / ``files.read``; medians over N runs, same machine, same run.

Run by hand, as root: ``.venv/bin/python bench/e2b_sdk.py [--n 10] [--rounds 30]``
(not ``e2b.py``: the script's directory comes first on ``sys.path``, and ``import e2b``
would import the script itself).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ms, fmt_ratio, median, progress, table  # noqa: E402
from _gateway import Setup, engine_and_gateway  # noqa: E402

TARGET_RATIO = 1.1  # E2B SDK create -> first command within 1.1x of ours, same gateway
BIG = 10 * 1024 * 1024
NAN = float("nan")
PATH = "/tmp/bench-e2b.bin"


class Client:
    """One SDK's create / run / write / read / kill, as user code calls them."""

    def __init__(self, name: str, create: Callable[[], Any]) -> None:
        self.name, self.create = name, create

    @staticmethod
    def run(sb: Any) -> str:
        return sb.commands.run("echo hi").stdout

    @staticmethod
    def write(sb: Any, data: bytes) -> None:
        sb.files.write(PATH, data)

    @staticmethod
    def read(sb: Any) -> bytes:
        if type(sb).__module__.startswith("e2b"):
            return bytes(sb.files.read(PATH, format="bytes"))
        return sb.files.read(PATH, format="bytes", max_bytes=BIG)

    @staticmethod
    def kill(sb: Any) -> None:
        if type(sb).__module__.startswith("e2b"):
            sb.kill()
        else:
            sb.kill(delete_volume=True)


def clients(setup: Setup) -> list[Client]:
    import e2b

    from agent_sandbox import Sandbox

    os.environ.update({"E2B_API_KEY": setup.tokens["bench"], "E2B_API_URL": setup.gateway.url,
                       "E2B_SANDBOX_URL": setup.gateway.url})
    remote = setup.remote("bench")
    return [Client("e2b SDK -> gateway", lambda: e2b.Sandbox.create()),
            Client("ours -> gateway", lambda: Sandbox.create(provider=remote)),
            Client("ours, embedded", lambda: Sandbox.create(provider=setup.local))]


def ms(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - started) * 1000, out


def round_trips(client: Client, sb: Any, rounds: int, copies: int) -> dict[str, float]:
    """On one sandbox: ``rounds`` commands, ``copies`` 10 MB writes and reads back."""
    data = os.urandom(BIG)
    runs = [ms(client.run, sb)[0] for _ in range(rounds)]
    writes, reads = [], []
    for _ in range(copies):
        writes.append(ms(client.write, sb, data)[0])
        took, back = ms(client.read, sb)
        assert back == data, "the 10 MB file came back different"
        reads.append(took)
    return {"run": median(runs), "write": median(writes), "read": median(reads)}


def measure(client: Client, n: int, rounds: int) -> dict[str, float]:
    firsts: list[float] = []
    found: dict[str, float] = {}
    for i in range(n + 1):  # the first is a warm-up (imports, connections)
        started = time.perf_counter()
        sb = client.create()
        try:
            out = client.run(sb)
            first = (time.perf_counter() - started) * 1000
            assert out == "hi\n", out
            if i:
                firsts.append(first)
            if i == 1:
                found = round_trips(client, sb, rounds, max(3, n // 2))
        finally:
            client.kill(sb)
    return {"first": median(firsts), **found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10, help="create -> first command runs")
    parser.add_argument("--rounds", type=int, default=30, help="commands.run round trips")
    args = parser.parse_args()
    with engine_and_gateway({"bench": {"max_sandboxes": 10, "e2b": True}}) as setup:
        results = {}
        for client in clients(setup):
            progress(f"{client.name}: {args.n} x create -> echo hi, {args.rounds} round trips, "
                     "10 MB write/read")
            try:
                results[client.name] = measure(client, args.n, args.rounds)
            except Exception as exc:  # noqa: BLE001 - the others still run; say why
                progress(f"{client.name} failed: {type(exc).__name__}: {exc}")
                results[client.name] = dict.fromkeys(("first", "run", "write", "read"), NAN)
    ours = results["ours -> gateway"]["first"]
    rows = [[name, fmt_ms(r["first"]), fmt_ratio(r["first"] / ours), fmt_ms(r["run"]),
             fmt_ms(r["write"]), fmt_ms(r["read"])] for name, r in results.items()]
    print(table(["client", "create -> echo hi", "vs ours -> gateway", "commands.run",
                 "10 MB write", "10 MB read"], rows,
                title=f"E2B SDK vs ours (medians; {args.n} creates, {args.rounds} runs)"))
    ratio = results["e2b SDK -> gateway"]["first"] / ours
    print(f"target: E2B SDK create -> first command <= {TARGET_RATIO:g}x ours through the "
          f"same gateway: {fmt_ratio(ratio)}, {'met' if ratio <= TARGET_RATIO else 'NOT met'}")


if __name__ == "__main__":
    main()
