"""Reserve the root engine's host id range in /etc/subuid and /etc/subgid.

The root engine maps every sandbox's root to host id 100000 (65536 ids). Debian's
``useradd`` hands each new user a subordinate range starting at 100000 unless that range
is taken, so without a reservation the first user's rootless sandboxes (and anything else
using that user's subids) would share host ids with root-engine sandboxes. A line
``agent-sandbox:100000:65536`` in both files makes ``useradd`` allocate after it.

``python -m agent_sandbox.backends.runc.host.subids`` reserves it (the setup script runs it before
any user is created); the root engine does the same on start.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT

OWNER = "agent-sandbox"
FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
log = logging.getLogger(__name__)


def ranges(text: str) -> list[tuple[str, int, int]]:
    """The ``name:start:size`` entries of an /etc/subuid or /etc/subgid text."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def overlaps(path: Path, base: int = HOST_ID_BASE, count: int = HOST_ID_COUNT) -> list[str]:
    """Entries of ``path`` (other than ours) whose range overlaps the engine's."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [f"{name}:{start}:{size}" for name, start, size in ranges(text)
            if name != OWNER and start < base + count and base < start + size]


def reserved(text: str) -> bool:
    """Does this subuid/subgid text hold our reservation?"""
    return any(name == OWNER for name, _, _ in ranges(text))


def _atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` keeping its mode and owner (new files: 0644 root)."""
    try:
        st = path.stat()
        mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    except FileNotFoundError:
        mode, uid, gid = 0o644, 0, 0
    tmp = path.with_name(f".{path.name}.abx-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fchown(fh.fileno(), uid, gid)
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def reserve(files: tuple[Path, ...] = FILES) -> list[str]:
    """Make sure each file holds our reservation line; returns warnings (overlaps with
    ranges given to other users before the reservation existed). Root only."""
    warnings = []
    line = f"{OWNER}:{HOST_ID_BASE}:{HOST_ID_COUNT}"
    for path in files:
        try:
            text = path.read_text() if path.exists() else ""
        except OSError as exc:
            warnings.append(f"cannot read {path}: {exc}")
            continue
        clash = overlaps(path)
        if clash:
            warnings.append(
                f"{path}: {', '.join(clash)} overlap the root engine's sandbox ids "
                f"{HOST_ID_BASE}-{HOST_ID_BASE + HOST_ID_COUNT - 1}: that user's rootless "
                f"containers would share host ids with root-engine sandboxes; move the "
                f"range (usermod --del-subuids/--add-subuids, --del-subgids/--add-subgids)")
        if reserved(text):
            continue
        if text and not text.endswith("\n"):
            text += "\n"
        try:
            _atomic_write(path, text + line + "\n")
        except OSError as exc:
            warnings.append(f"cannot reserve ids in {path}: {exc}")
    for warning in warnings:
        log.warning("agent-sandbox: %s", warning)
    return warnings


def main() -> int:
    if os.geteuid() != 0:
        print("subids: run as root (it edits /etc/subuid and /etc/subgid)", file=sys.stderr)
        return 1
    warnings = reserve()
    for warning in warnings:
        print(f"subids: warning: {warning}", file=sys.stderr)
    print(f"subids: host ids {HOST_ID_BASE}+{HOST_ID_COUNT} reserved for {OWNER} in "
          f"{', '.join(map(str, FILES))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
