"""Gateway overhead: ``commands.run("true")`` p50 sequentially and p99 under 100 concurrent
clients, remote (through a loopback gateway) next to the local provider, same run.

Run by hand, as root: ``.venv/bin/python bench/gateway.py [--n 200] [--clients 100]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile  # noqa: E402
from _gateway import engine_and_gateway  # noqa: E402

from agent_sandbox.core.provider import Provider  # noqa: E402


def _sequential(provider: Provider, sid: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        provider.run(sid, "true")
        out.append((time.perf_counter() - t) * 1000)
    return out


def _concurrent(provider: Provider, sid: str, clients: int, each: int) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client() -> None:
        barrier.wait()
        for _ in range(each):
            t = time.perf_counter()
            provider.run(sid, "true")
            with lock:
                out.append((time.perf_counter() - t) * 1000)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--each", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with engine_and_gateway({"bench": {"max_sandboxes": 10,
                                       "max_commands": args.clients * 2}}) as setup:
        for name, provider in (("local", setup.local), ("remote", setup.remote("bench"))):
            sid = provider.create().sandbox_id
            try:
                _sequential(provider, sid, 10)  # warm up
                seq = _sequential(provider, sid, args.n)
                conc = _concurrent(provider, sid, args.clients, args.each)
                rows.append((name, percentile(seq, 50), percentile(conc, 50),
                             percentile(conc, 99)))
            finally:
                provider.kill(sid, delete_volume=True)
    print(f"{'provider':<10}{'seq p50 ms':>12}{f'{args.clients}x p50 ms':>14}"
          f"{f'{args.clients}x p99 ms':>14}")
    for name, p50, cp50, cp99 in rows:
        print(f"{name:<10}{p50:>12.2f}{cp50:>14.2f}{cp99:>14.2f}")


if __name__ == "__main__":
    main()
