"""How every call reaches a sandbox's guest, whichever backend keeps it: the sandbox's
record and template, the environment a command starts with, and one guest operation run
with the sandbox counted busy, a gone guest replaced once, and a guest that breaks the
protocol stopped. The commands, files, terminals and kernels of the service stand on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core import inside, validate
from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.core.templates import Template
from agent_sandbox.guestlink.client import GuestClient, GuestProtocolError, GuestUnavailableError
from agent_sandbox.service.activity import Activity, streamed
from agent_sandbox.service.backend import Backend
from agent_sandbox.service.code.kernels import Kernels
from agent_sandbox.service.record import SandboxRecord

TEMPLATE_REUSE = 2.0  # seconds a template's metadata serves calls to live sandboxes


class GuestAccess:
    """The base of the service: a backend, the sandboxes' activity and their kernels."""

    def __init__(self, backend: Backend, config: EngineConfig) -> None:
        self.backend = backend
        self.config = config
        self._stop = threading.Event()
        # Set by whatever moves a sandbox's next reaper deadline (a timeout set, a resume,
        # a create, a sandbox's last call ending): the reaper then looks again at once.
        self.reaper_wake = threading.Event()
        self.activity = Activity(backend.touch, self._stop, self.reaper_wake.set)
        self.code = Kernels(self, backend.kernel_files(self))
        self._templates_seen: dict[str, tuple[float, Template]] = {}

    # what kernels need (code.files.KernelHost) --------------------------------------------
    @property
    def sandbox_owner(self) -> int | None:
        return self.backend.sandbox_owner

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.backend.sandbox_dir(sandbox_id)

    def client(self, sandbox_id: str) -> GuestClient:
        return self.backend.client(sandbox_id)

    def guest(self, sandbox_id: str, row: SandboxRecord | None = None) -> GuestClient:
        return self.backend.guest(sandbox_id, row)

    def touch(self, sandbox_id: str) -> None:
        self.backend.touch(sandbox_id)

    def row(self, sandbox_id: str) -> SandboxRecord:
        """A live sandbox's record (NotFoundError for an id of none)."""
        validate.sandbox_id(sandbox_id)
        return self.backend.record(sandbox_id)

    def template_for(self, row: SandboxRecord) -> Template:
        """The template's metadata (workdir, env, commands) for a call to a live sandbox.
        A shared template's trust checks cost ~50 us and every call asked for it twice:
        an answer is reused for ``TEMPLATE_REUSE`` seconds (creates always check afresh)."""
        seen = self._templates_seen.get(row.template)
        if seen is not None and seen[0] > time.monotonic():
            return seen[1]
        try:
            tmpl = self.backend.template(row.template)
        except NotFoundError:
            # The template was removed after the sandbox was made: its layers are frozen
            # in the record; the guest interpreter falls back to the default.
            return Template(name=row.template, kind="gone", layers=[])
        self._templates_seen[row.template] = (time.monotonic() + TEMPLATE_REUSE, tmpl)
        return tmpl

    def env(self, row: SandboxRecord, extra: dict[str, str] | None) -> dict[str, str]:
        env = inside.base_env(row.id)
        env.update(self.backend.guest_env(row))
        env.update(self.template_for(row).env)
        env.update(row.envs)
        env.update(validate.envs(extra))
        return env

    # one guest operation --------------------------------------------------------------------
    def call(self, sandbox_id: str, fn: Callable[[GuestClient], Any],
             row: SandboxRecord | None = None) -> Any:
        """Run a guest operation; a guest that is gone (OOM, a crash, a lost Pod) is
        replaced once. A guest that breaks the protocol is stopped: the next call boots a
        genuine one."""
        client = self.backend.guest(sandbox_id, row)
        try:
            with self.activity.busy(sandbox_id):
                try:
                    return fn(client)
                except GuestUnavailableError:
                    again = self.backend.replace_guest(sandbox_id, client)
                    if again is None:
                        raise
                    return fn(again)
        except GuestProtocolError as exc:
            self.backend.stop_misbehaving(sandbox_id)
            raise GuestProtocolError(f"sandbox {sandbox_id} misbehaved and was stopped ({exc}); "
                                     "its next use restarts it, without its processes") from None

    def stream(self, sandbox_id: str,
               fn: Callable[[GuestClient], Iterator[bytes]]) -> Iterator[bytes]:
        """A guest operation that answers in chunks (``activity.streamed``)."""
        return streamed(self.activity, sandbox_id, self.call(sandbox_id, fn))

    # what backends ask of the service (backend.ServiceHooks) --------------------------------
    def guest_gone(self, sandbox_id: str, *, keep_contexts: bool = True) -> None:
        self.code.forget(sandbox_id, keep_contexts=keep_contexts)

    def pooled(self, record: SandboxRecord) -> None:
        self.code.warm(record)
