"""What every sandbox looks like from the inside, whichever backend runs it: where the
guest agent and its run directory are, the PATH and environment commands get, and the
capabilities root in a sandbox keeps."""

from __future__ import annotations

GUEST_DIR = "/.abx/guest"  # the guest agent's code, read-only
GUEST_RUN_DIR = "/.abx/run"  # its sockets and the code kernels' connection files
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What a root user inside an ordinary container keeps, less NET_RAW and MKNOD.
CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
    "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


def base_env(sandbox_id: str) -> dict[str, str]:
    """What every command starts with, before the template's, the sandbox's and the
    call's own variables."""
    return {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm",
            "SANDBOX_ID": sandbox_id}
