"""What an imported root filesystem needs before it may become a template."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent_sandbox.backends.runc.oci.layers import resolve_in_root
from agent_sandbox.core.errors import InvalidArgumentError


def check_shell(rootfs: Path) -> None:
    """Every command runs as ``/bin/sh -c``: a root without an executable /bin/sh (links
    followed inside the root only) would make sandboxes that cannot run anything."""
    try:
        sh = resolve_in_root(rootfs, "/bin/sh")
        st = os.stat(sh, follow_symlinks=False)
        usable = stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)
    except (OSError, InvalidArgumentError):
        usable = False
    if not usable:
        raise InvalidArgumentError(
            f"{rootfs} has no executable /bin/sh, and every command runs through "
            "`/bin/sh -c`: add a shell to it (busybox or dash as /bin/sh), or import an "
            "image that has one")
