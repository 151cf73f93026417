"""Helpers shared by the benchmarks: statistics, a timer, a plain-text table, progress.

Standard library only, so a bench runs on a bare interpreter and its output can be pasted
anywhere (no colours, no box-drawing characters).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100) with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within 0..100, got {pct}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p95, min and max of a sample (NaN for an empty one)."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


class Timer:
    """Wall-clock milliseconds of a ``with`` block: ``with Timer() as t: ...; t.ms``."""

    def __init__(self) -> None:
        self._start = 0.0
        self.ms = math.nan

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ms = (time.perf_counter() - self._start) * 1000


@contextmanager
def timed(samples: list[float]) -> Iterator[None]:
    """Append the block's duration in milliseconds to ``samples`` (only if it succeeds)."""
    start = time.perf_counter()
    yield
    samples.append((time.perf_counter() - start) * 1000)


def fmt_ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms"


def fmt_mb(value_bytes: float | None) -> str:
    if value_bytes is None or math.isnan(value_bytes):
        return "-"
    return f"{value_bytes / (1024 * 1024):.1f} MB"


def fmt_ratio(value: float | None) -> str:
    if value is None or math.isnan(value) or math.isinf(value):
        return "-"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *,
          title: str | None = None) -> str:
    """A plain, left-aligned text table; a row of one cell is printed as a section line."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        if len(row) == 1:
            continue
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    rule = "-+-".join("-" * w for w in widths)

    def line(row: Sequence[str]) -> str:
        return " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()

    out = [title, "=" * len(title)] if title else []
    out += [line(list(headers)), rule]
    for row in cells:
        if len(row) == 1:
            out.append(f"-- {row[0]} --")
        else:
            out.append(line(row + [""] * (len(headers) - len(row))))
    return "\n".join(out)


def progress(message: str) -> None:
    """A progress line on stderr (stdout is kept for results)."""
    print(message, file=sys.stderr, flush=True)
