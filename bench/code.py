"""Code interpreter benchmark: kernel cold start and warm ``1+1`` round trips.

Run by hand, as root, from the repository root::

    .venv/bin/python bench/code.py [--iterations 200] [--cold 5] [--first-cell 5] [--json]

``--first-cell N`` times what a user of a new sandbox waits for, create to the first
cell's result, N times each way, alternating: from a warm pool of one (its kernel started
by the pool) and from a cold create (the kernel started by that cell).

Uses the engine's data dir (``ABX_DATA_DIR``, default /var/lib/agent-sandbox), so the
code-interpreter-v1 template built by ``scripts/setup.sh`` is reused (built here if
missing). The sandbox it makes is killed at the end. Progress goes to stderr, results to
stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _common import fmt_ms, progress, summary, table

TARGET_WARM_P50_MS = 10.0
TARGET_FIRST_CELL_MS = 300.0  # create -> first cell's result, pooled (issue 34)


def first_cells(runs: int, template: str) -> dict[str, dict[str, float]]:
    """create + run_code('1+1'), from a warm pool of one and cold, alternating."""
    from agent_sandbox.config.engine import EngineConfig
    from agent_sandbox.providers.local import embedded_service

    pooled = embedded_service(EngineConfig(pool_size=1, pool_templates=(template,)),
                              reaper=False)
    cold = embedded_service(EngineConfig(pool_size=0), reaper=False)
    pooled.backend.open()
    samples: dict[str, list[float]] = {"first_cell_pooled_ms": [], "first_cell_cold_ms": []}
    made: list[tuple[object, str]] = []

    def warm() -> bool:
        return any(r.state == "pooled" and (r.id, "default") in pooled.code._kernels
                   for r in pooled.backend.store.list_sandboxes())
    try:
        for i in range(runs):
            deadline = time.monotonic() + 300
            while not warm():
                if time.monotonic() > deadline:
                    raise RuntimeError("the pool did not warm a kernel within 300 s")
                time.sleep(0.02)
            for name, engine in (("first_cell_pooled_ms", pooled), ("first_cell_cold_ms", cold)):
                started = time.perf_counter()
                sid = engine.create(template=template).sandbox_id
                made.append((engine, sid))
                r = engine.run_code(sid, "1+1")
                samples[name].append((time.perf_counter() - started) * 1000)
                assert r.text == "2", r
                engine.kill(sid, delete_volume=True)
                made.pop()
            progress(f"first cell {i + 1}/{runs}: pooled {samples['first_cell_pooled_ms'][-1]:.0f}"
                     f" ms, cold {samples['first_cell_cold_ms'][-1]:.0f} ms")
    finally:
        for engine, sid in made:
            engine.kill(sid, delete_volume=True)  # type: ignore[attr-defined]
        pooled.close()
        while any(r.state == "creating" for r in pooled.backend.store.list_sandboxes()):
            time.sleep(0.05)
        pooled.drain_pool()
        cold.close()
    return {k: summary(v) for k, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="warm 1+1 round trips")
    parser.add_argument("--cold", type=int, default=5, help="kernel cold starts")
    parser.add_argument("--first-cell", type=int, default=0,
                        help="create -> first cell, pooled and cold, this many times each")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()

    from agent_sandbox.backends.runc.templates import code_interpreter as code_template
    from agent_sandbox.providers.local import embedded_service

    engine = embedded_service(reaper=False)
    progress("ensuring the code-interpreter-v1 template")
    code_template.ensure(engine.backend.templates)
    sandbox_id = engine.create(template=code_template.NAME).sandbox_id
    try:
        cold: list[float] = []
        for i in range(args.cold):
            # A cold start: the kernel process starts inside the sandbox, binds its
            # sockets, answers, and runs a first cell. The first one is the default
            # context's lazy start; the others are fresh contexts.
            started = time.perf_counter()
            ctx = engine.create_code_context(sandbox_id) if i else None
            r = engine.run_code(sandbox_id, "1+1", context=ctx)
            cold.append((time.perf_counter() - started) * 1000)
            assert r.text == "2", r
            progress(f"cold start {i + 1}/{args.cold}: {cold[-1]:.0f} ms")
        for _ in range(20):
            engine.run_code(sandbox_id, "1+1")
        warm: list[float] = []
        for _ in range(args.iterations):
            started = time.perf_counter()
            engine.run_code(sandbox_id, "1+1")
            warm.append((time.perf_counter() - started) * 1000)
        warm_png: list[float] = []
        engine.run_code(sandbox_id, "import matplotlib.pyplot as plt")
        for _ in range(10):
            started = time.perf_counter()
            r = engine.run_code(sandbox_id, "plt.plot([1, 2, 3]); plt.show()")
            warm_png.append((time.perf_counter() - started) * 1000)
            assert r.results and r.results[0].png
    finally:
        engine.kill(sandbox_id, delete_volume=True)
        engine.close()

    stats = {"kernel_cold_start_ms": summary(cold), "warm_1plus1_ms": summary(warm),
             "warm_matplotlib_png_ms": summary(warm_png),
             "target_warm_p50_ms": TARGET_WARM_P50_MS}
    if args.first_cell:
        stats.update(first_cells(args.first_cell, code_template.NAME))
    ok = stats["warm_1plus1_ms"]["p50"] <= TARGET_WARM_P50_MS
    if args.json:
        print(json.dumps({**stats, "warm_target_met": ok}))
    else:
        rows = [[name, s["n"], fmt_ms(s["p50"]), fmt_ms(s["p95"]), fmt_ms(s["min"]),
                 fmt_ms(s["max"])] for name, s in stats.items() if isinstance(s, dict)]
        print(table(["measure", "n", "p50", "p95", "min", "max"], rows,
                    title="code interpreter"))
        print(f"warm 1+1 p50 target <= {TARGET_WARM_P50_MS:g} ms: "
              f"{'met' if ok else 'NOT met'}")
        if args.first_cell:
            first = stats["first_cell_pooled_ms"]["p50"]  # type: ignore[index]
            print(f"create -> first cell (pooled) p50 target <= {TARGET_FIRST_CELL_MS:g} ms: "
                  f"{'met' if first <= TARGET_FIRST_CELL_MS else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
