"""Templates from recipes: a 5-step recipe built cold (every step run, each RUN in a
sandbox) and again unchanged (every step a cache hit), the cost of a change to its last
step; and the layer storage two templates with a common prefix share.

Run by hand, as root, on a scratch data dir: ``ABX_DATA_DIR=/tmp/abx-bench .venv/bin/python
bench/templates.py [--runs 3]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_mb, fmt_ms, median, progress, table  # noqa: E402

from agent_sandbox.providers.local import local_provider  # noqa: E402

# 5 steps after FROM: ENV, WORKDIR, COPY, RUN (a few MiB of files), RUN (a small edit).
RECIPE = """FROM base
ENV APP=/opt/bench
WORKDIR /opt/bench
COPY data/ ./
RUN python3 -c "import os; [open(f'f{{i}}', 'wb').write(os.urandom(1 << 20)) for i in range(8)]"
RUN echo {nonce} > last
"""


def build(svc: object, name: str, text: str, context: Path) -> float:
    started = time.monotonic()
    svc.build_recipe(name, text, context=str(context), network="off")  # type: ignore[attr-defined]
    return (time.monotonic() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    svc = local_provider()
    context = Path(tempfile.mkdtemp(prefix="abx-bench-ctx-"))
    (context / "data").mkdir()
    for i in range(4):
        (context / "data" / f"c{i}").write_bytes(os.urandom(256 << 10))
    cold, cached, changed = [], [], []
    for run in range(args.runs):
        nonce = f"{os.getpid()}-{run}-{time.time_ns()}"
        progress(f"run {run + 1}/{args.runs}: cold")
        # A fresh first RUN each time (its command differs): nothing of it is cached.
        text = RECIPE.replace("range(8)", f"range(8) if '{nonce}'").format(nonce=nonce)
        cold.append(build(svc, "bench-recipe", text, context))
        cached.append(build(svc, "bench-recipe", text, context))
        changed.append(build(svc, "bench-recipe", text.replace(f"echo {nonce}", "echo x"),
                             context))
    print(table(["recipe (5 steps)", "p50"], [["cold", fmt_ms(median(cold))],
                                        ["unchanged (all cached)", fmt_ms(median(cached))],
                                        ["last step changed", fmt_ms(median(changed))]]))
    # Two templates sharing the first four steps: their layers are stored once.
    layers = svc.backend.recipes()  # type: ignore[attr-defined]
    one = svc.backend.template("bench-recipe")  # type: ignore[attr-defined]
    text = RECIPE.format(nonce="other")
    build(svc, "bench-recipe-2", text.replace("range(8)", "range(8) if 'shared'"), context)
    build(svc, "bench-recipe", text.replace("range(8)", "range(8) if 'shared'").replace(
        "echo other", "echo mine"), context)
    one = svc.backend.template("bench-recipe")  # type: ignore[attr-defined]
    two = svc.backend.template("bench-recipe-2")  # type: ignore[attr-defined]
    own1, own2 = (set(t.build_inputs["recipe_own"]) for t in (one, two))
    separate = sum(layers.size(k) for k in own1) + sum(layers.size(k) for k in own2)
    stored = sum(layers.size(k) for k in own1 | own2)
    print(table(["two templates, 4 steps in common", "bytes"],
          [["their layers, counted per template", fmt_mb(separate)],
           ["stored (shared layers once)", fmt_mb(stored)],
           ["layers shared", str(len(own1 & own2))]]))
    for name in ("bench-recipe", "bench-recipe-2"):
        svc.remove_template(name)
    svc.prune_layers()


if __name__ == "__main__":
    main()
