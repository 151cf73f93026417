"""A runc sandbox's kernel files: its run dir is a host directory the sandbox can write
(``/.abx/run`` inside), so the host makes and removes files there only beneath a confined
descriptor, always new, never following anything the sandbox planted."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path

from agent_sandbox.backends.runc.rootfs import confined
from agent_sandbox.service.code.files import PORTS, KernelFiles, KernelState, connection
from agent_sandbox.service.code.users import CONNECTION, dir_name, sockets_inside

_MAX_ENTRIES = 4096  # a context's own directory: what is unlinked in it, at most


class RunDirKernelFiles(KernelFiles):
    def run_dir(self, sandbox_id: str) -> Path:
        return self.host.sandbox_dir(sandbox_id) / "run"

    def write_connection(self, sandbox_id: str, state: KernelState) -> None:
        """``run/<prefix>.json`` (an account's context: ``run/<prefix>.d/kernel.json``),
        made new (never an existing file or link)."""
        assert state.prefix is not None
        run = confined.open_dir(self.run_dir(sandbox_id))
        try:
            if state.user is None:
                fd = confined.open_beneath(run, f"{state.prefix}.json",
                                           os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            else:
                fd = self._own_dir_file(sandbox_id, run, state.prefix)
        finally:
            os.close(run)
        # The kernel (the sandbox's root) may rewrite it: owned by that user, by fchown.
        if self.host.sandbox_owner is not None:
            os.fchown(fd, self.host.sandbox_owner, self.host.sandbox_owner)
        with os.fdopen(fd, "w") as fh:
            json.dump(connection(state, sockets_inside(state.prefix, state.user)), fh)

    def _own_dir_file(self, sandbox_id: str, run: int, prefix: str) -> int:
        """A new ``<prefix>.d`` (the sandbox root's until ``kernel_user.hand_over``) and a
        new connection file in it; the run dir made traversable."""
        open_run_to_accounts(self.run_dir(sandbox_id))
        os.mkdir(dir_name(prefix), 0o700, dir_fd=run)  # EEXIST if anything is there
        try:
            sub = confined.open_beneath(run, dir_name(prefix), os.O_RDONLY | os.O_DIRECTORY)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(dir_name(prefix), dir_fd=run)
            raise
        try:
            if self.host.sandbox_owner is not None:
                os.fchown(sub, self.host.sandbox_owner, self.host.sandbox_owner)
            return confined.open_beneath(sub, CONNECTION, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        finally:
            os.close(sub)

    def remove(self, sandbox_id: str, state: KernelState) -> None:
        if not state.prefix:
            return
        names = [f"{state.prefix}.json", *(f"{state.prefix}-{p}" for p in PORTS.values())]
        with contextlib.suppress(OSError):
            run = confined.open_dir(self.run_dir(sandbox_id))
            try:
                if state.user is not None:
                    self._empty_own_dir(run, dir_name(state.prefix))
                    with contextlib.suppress(OSError):
                        os.rmdir(dir_name(state.prefix), dir_fd=run)  # never follows
                    names = []
                for name in names:
                    with contextlib.suppress(OSError):
                        confined.unlink_beneath(run, name)
            finally:
                os.close(run)

    @staticmethod
    def _empty_own_dir(run: int, name: str) -> None:
        """Unlink what an account's context directory holds (the account's: anything it
        made there, a bounded number of entries, nothing followed, subdirectories left)."""
        with contextlib.suppress(OSError):
            sub = confined.open_beneath(run, name, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with os.scandir(sub) as entries:
                    found = [e.name for e in itertools.islice(entries, _MAX_ENTRIES)]
                for entry in found:
                    with contextlib.suppress(OSError):
                        confined.unlink_beneath(sub, entry)
            finally:
                os.close(sub)


def open_run_to_accounts(run_dir: os.PathLike[str] | str) -> None:
    """Let accounts traverse the run dir (0711: they reach their own directory by name;
    nothing in it is listable, and root contexts' files stay 0600 / the kernel's)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode & 0o7777
        if mode & 0o011 != 0o011:
            os.fchmod(fd, mode | 0o011)
    finally:
        os.close(fd)
