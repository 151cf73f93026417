"""Which CRIU memory snapshots use on this host, and whether it works here.

Bookworm's CRIU 3.17 fails on recent kernels and 4.1 cannot dump an inet socket, so a
CRIU >= 4.2 is needed: ``scripts/criu_build.sh`` (run by ``scripts/setup.sh``) builds one
into /var/cache/abx-criu, or a distro's is used where it is new enough. ``ABX_CRIU``
names another binary. Every answer says what to do when snapshots cannot work.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import subprocess
from dataclasses import dataclass

from agent_sandbox.backends.runc.host import syscalls

CACHE_BINARY = "/var/cache/abx-criu/bin/criu"
CANDIDATES = (CACHE_BINARY, "/usr/local/sbin/criu", "/usr/sbin/criu")
MINIMUM = (4, 2)
FIX = ("as root: bash scripts/setup.sh (it builds CRIU 4.2 into /var/cache/abx-criu; "
       "scripts/criu_build.sh alone does only that), or set ABX_CRIU to a CRIU >= 4.2")
_CHECK_TIMEOUT = 30.0


@dataclass(frozen=True)
class Criu:
    """A CRIU binary and whether ``criu check`` passes (``problem`` says why not)."""

    path: str
    version: str
    problem: str

    @property
    def ok(self) -> bool:
        return not self.problem


def version_of(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=_CHECK_TIMEOUT).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"Version:\s*(\S+)", out)
    return found.group(1) if found else ""


def _new_enough(version: str) -> bool:
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    return parts >= MINIMUM


def _check(path: str) -> str:
    """'' when ``criu check`` passes, else its last words."""
    try:
        proc = subprocess.run([path, "check"], capture_output=True, text=True,
                              timeout=_CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} check did not run: {exc}"
    if proc.returncode == 0:
        return ""
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    return f"`{path} check` fails on this kernel: {lines[-1].strip() if lines else 'no output'}"


@functools.lru_cache(maxsize=1)
def find() -> Criu:
    """The CRIU to use (cached for the process): ABX_CRIU, the setup's build, a distro's."""
    if os.geteuid() != 0:
        return Criu("", "", "memory snapshots need the root engine (CRIU restores as root); "
                    "this engine runs as an ordinary user")
    named = os.environ.get("ABX_CRIU", "")
    tried: list[str] = []
    for path in ([named] if named else list(CANDIDATES)):
        if not os.access(path, os.X_OK):
            continue
        version = version_of(path)
        if not _new_enough(version):
            tried.append(f"{path} is {version or 'of unknown version'} (needs >= 4.2)")
            continue
        return Criu(path, version, _check(path))
    where = "; ".join(tried) or f"no CRIU at {named or ', '.join(CANDIDATES)}"
    return Criu("", "", f"{where}")


RUN_DIR = "run"  # beside the setup's build's bin/ (scripts/criu_build.sh): its kernel cache
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8


@functools.lru_cache(maxsize=4)
def keep_kernel_cache(binary: str) -> None:
    """CRIU learns the kernel's features at every start (~50 ms of each dump and restore)
    unless it may cache them, which it does only on a tmpfs (gone with the kernel). The
    setup's build keeps its cache in ``run/`` beside its ``bin/``: mounted here as a small
    tmpfs, root's alone, once per boot. Any other CRIU (a distro's: /run) is left as is."""
    run = os.path.join(os.path.dirname(os.path.dirname(binary)), RUN_DIR)
    try:
        st = os.lstat(run)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or os.path.ismount(run):
        return
    try:
        syscalls.mount("tmpfs", run, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                       "size=1m,nr_inodes=64,mode=0700")
    except OSError:
        pass  # no cache: every run of CRIU learns the kernel again, nothing else changes


def problem() -> str:
    """'' when memory snapshots work here, else why not and the fix."""
    found = find()
    return "" if found.ok else f"{found.problem}. Fix: {FIX}"
