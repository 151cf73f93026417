"""Keeping tool output within a budget a model's context can take."""

from __future__ import annotations

OUTPUT_DIR = "/tmp/abx-output"


def split_budget(sizes: list[int], budget: int) -> list[int]:
    """Share ``budget`` between several streams: small ones keep all, big ones share the rest."""
    if sum(sizes) <= budget:
        return list(sizes)
    shares = [0] * len(sizes)
    left = budget
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for rank, i in enumerate(order):
        fair = left // (len(sizes) - rank)
        shares[i] = min(sizes[i], fair)
        left -= shares[i]
    return shares


def cut(text: str, keep: int, saved_to: str | None) -> str:
    """Head and tail of ``text`` (``keep`` characters in all) around a marker."""
    if len(text) <= keep:
        return text
    head = keep // 2
    tail = keep - head
    where = f"; the whole output is in {saved_to} (read_file with offset/limit)" if saved_to else ""
    marker = f"\n[... {len(text) - keep} characters cut{where} ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")
