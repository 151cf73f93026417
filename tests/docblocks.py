"""The fenced code blocks of the README and docs/*.md, and the commands of a shell block, as
tests/test_docs.py runs them."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL = ("sh", "bash")
_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the checkout
    line: int  # of the opening fence, 1-based
    lang: str  # "" when the fence names none
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    def first(self) -> str:
        """The first line that says something (not blank, not a comment)."""
        for line in self.text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                return line.strip()
        return ""


def blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc``, in order (a fence left open is an error)."""
    found: list[Block] = []
    lines = (ROOT / doc).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i].strip())
        if m is None:
            i += 1
            continue
        fence, start = m.group(1), i
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            i += 1
        if i == len(lines):
            raise ValueError(f"{doc}:{start + 1}: code fence never closed")
        found.append(Block(doc, start + 1, m.group(2), "\n".join(lines[start + 1:i]) + "\n"))
        i += 1
    return found


def commands(text: str) -> list[str]:
    """The commands of a shell block: comment-only and blank lines dropped, a line ending in
    a backslash or inside an open quote joined with the next."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        out.append(pending.strip())
        pending = ""
    if pending:
        raise ValueError(f"a shell command never ends: {pending!r}")
    return out
