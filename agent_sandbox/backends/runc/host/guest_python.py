"""The interpreter the guest agent runs on: the host's own python3, read-only."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import RuntimeUnavailableError

# Where every sandbox sees the host's /usr, read-only: the guest agent runs from it.
HOST_USR = "/.abx/hostusr"
GUEST_EXE = "/usr/bin/python3"  # the host's, which the guest agent runs on


@dataclass
class GuestPython:
    """How to start the guest agent in a template: argv prefix, env, extra mounts."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)


def host_python() -> GuestPython:
    """The host's python3 seen through a read-only bind of its /usr, started by the
    host's dynamic loader with the host's libraries: it needs nothing from the template,
    not even a libc."""
    exe = Path(GUEST_EXE)
    real = Path(os.path.realpath(exe))
    loader = Path(os.path.realpath(_elf_interpreter(real)))
    if not _under_usr(real) or not _under_usr(loader):
        raise RuntimeUnavailableError(
            "the guest agent runs on the host's python3, but it or its loader is outside "
            "/usr; install python3 from the distribution (apt-get install python3)")
    libdirs = [str(loader.parent), "/usr/lib"]
    return GuestPython(
        # bin/python3, not python3.X: the template survives a host python upgrade.
        argv=[_in_sandbox(loader), "--library-path",
              ":".join(_in_sandbox(Path(d)) for d in dict.fromkeys(libdirs)), _in_sandbox(exe)],
        env={"PYTHONHOME": HOST_USR},
        mounts=[{"destination": HOST_USR, "type": "bind", "source": "/usr",
                 "options": ["rbind", "nosuid", "nodev", "ro"]}],
    )


def _under_usr(path: Path) -> bool:
    return path.parts[:2] == ("/", "usr")


def _in_sandbox(host_path: Path) -> str:
    return HOST_USR + str(host_path)[len("/usr"):]


def _elf_interpreter(path: Path) -> str:
    """The PT_INTERP (dynamic loader) path of an ELF executable."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF":
            raise RuntimeUnavailableError(f"{path} is not an ELF executable")
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        phoff = struct.unpack_from(order + ("Q" if wide else "I"), head, 0x20 if wide else 0x1C)[0]
        entsize, count = struct.unpack_from(order + "HH", head, 0x36 if wide else 0x2A)
        for i in range(count):
            fh.seek(phoff + i * entsize)
            ph = fh.read(entsize)
            if struct.unpack_from(order + "I", ph, 0)[0] != 3:  # PT_INTERP
                continue
            fmt, off_at, size_at = (order + "Q", 8, 32) if wide else (order + "I", 4, 16)
            offset, size = struct.unpack_from(fmt, ph, off_at)[0], struct.unpack_from(
                fmt, ph, size_at)[0]
            fh.seek(offset)
            return fh.read(size).rstrip(b"\0").decode()
    raise RuntimeUnavailableError(f"{path} is statically linked: no loader to reuse")
