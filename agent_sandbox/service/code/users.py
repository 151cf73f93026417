"""Code contexts that run as an account of the sandbox (``create_code_context(user=)``).

A root context's kernel keeps its files in the run dir itself (``run/<prefix>.json`` and
the sockets ``run/<prefix>-N``), which stays the sandbox root's (0700). A context of an
account runs its kernel and its bridge as that account, so it gets a directory of its own,
``run/<prefix>.d/``, for its connection file (``kernel.json``) and sockets (``k-N``):

- the guest resolves the account (an exec as it: the guest's own checks, so an unknown
  name or an id a rootless sandbox does not map is its clear error, and the default
  account ``user`` is made where a template lacks it) and the exec prints its ids;
- the host makes the directory and the connection file (confined, always new, never an
  existing entry) and lets the account traverse the run dir (0711: still not listable);
- the sandbox's root gives both to the account (a root exec in the sandbox: it can chown
  to ids the engine's user cannot in a rootless sandbox).

From then on everything in that directory is the account's, which is the sandbox's: the
host never reads it and only unlinks in it beneath a confined descriptor
(``KernelFiles.remove``).
"""

from __future__ import annotations

import re

from agent_sandbox.core.errors import RuntimeUnavailableError, SandboxError
from agent_sandbox.core.inside import GUEST_RUN_DIR
from agent_sandbox.guestlink.client import GuestClient

CONNECTION = "kernel.json"  # in the context's own directory
SOCKETS = "k"  # the sockets are <dir>/k-<port>
_IDS = b'import os; print(os.getuid(), os.getgid())'
# Runs as the sandbox's root on the kernel's interpreter: the directory and the file in it,
# never through a link, to the account.
_HAND_OVER = b"""\
import os, sys
uid, gid = int(sys.argv[2]), int(sys.argv[3])
d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
f = os.open(%r, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=d)
for fd in (d, f):
    os.fchown(fd, uid, gid)
""" % CONNECTION.encode()
_ID_LINE = re.compile(rb"(\d{1,10}) (\d{1,10})\n?")
_TIMEOUT = 30.0


def dir_name(prefix: str) -> str:
    """The context's own directory, in the run dir."""
    return f"{prefix}.d"


def connection_inside(prefix: str, user: str | None) -> str:
    """Where the kernel (and its bridge) find the connection file, inside the sandbox."""
    if user is None:
        return f"{GUEST_RUN_DIR}/{prefix}.json"
    return f"{GUEST_RUN_DIR}/{dir_name(prefix)}/{CONNECTION}"


def sockets_inside(prefix: str, user: str | None) -> str:
    """The kernel's ``ip``: its sockets are ``<this>-<port>``."""
    if user is None:
        return f"{GUEST_RUN_DIR}/{prefix}"
    return f"{GUEST_RUN_DIR}/{dir_name(prefix)}/{SOCKETS}"


def account_ids(guest: GuestClient, python: str, user: str) -> tuple[int, int]:
    """The uid and gid of ``user`` in the sandbox, as the guest runs it (its errors: an
    unknown account, ids this sandbox does not map)."""
    result = guest.exec([python, "-I", "-S", "-c", _IDS.decode()], cwd="/", env={},
                        timeout=_TIMEOUT, max_output=256, user=user)
    found = _ID_LINE.fullmatch(result.stdout)  # the sandbox's answer: checked, bounded
    if result.exit_code != 0 or found is None:
        raise RuntimeUnavailableError(
            f"could not run the kernel's python as {user!r} (exit code {result.exit_code}): "
            + result.stderr.decode(errors="replace").strip()[-500:])
    return int(found[1]), int(found[2])


def hand_over(guest: GuestClient, python: str, prefix: str, ids: tuple[int, int]) -> None:
    """Give the context's directory and connection file to the account (a root exec)."""
    where = f"{GUEST_RUN_DIR}/{dir_name(prefix)}"
    try:
        result = guest.exec([python, "-I", "-S", "-c", _HAND_OVER.decode(), where,
                             str(ids[0]), str(ids[1])], cwd="/", env={}, timeout=_TIMEOUT,
                            max_output=4096)
    except SandboxError as exc:
        raise RuntimeUnavailableError(f"could not prepare the kernel's directory: {exc}"
                                      ) from exc
    if result.exit_code != 0:
        raise RuntimeUnavailableError(
            "could not give the kernel's directory to its account: "
            + result.stderr.decode(errors="replace").strip()[-500:])
