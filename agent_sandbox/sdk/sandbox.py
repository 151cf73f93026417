"""``Sandbox``: one isolated sandbox, driven synchronously."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import (
    CodeContext,
    CommandResult,
    Execution,
    Result,
    SandboxInfo,
    SandboxLogEntry,
    SnapshotInfo,
)
from agent_sandbox.core.network import NetworkSpec
from agent_sandbox.core.shares import PortShare
from agent_sandbox.core.spec import CreateSpec, sdk_defaults
from agent_sandbox.providers import Provider, default_provider
from agent_sandbox.sdk.commands import Commands
from agent_sandbox.sdk.files import Files
from agent_sandbox.sdk.pty import Pty
from agent_sandbox.sdk.twin import asks_provider

F = TypeVar("F")
_PLAIN = inspect.Parameter.POSITIONAL_OR_KEYWORD

# ``create(cls, <the options of core.spec.CreateSpec>, provider=None)``: the options are
# defined once, there.
CREATE_SIGNATURE = inspect.Signature(
    [inspect.Parameter("cls", _PLAIN)]
    + [inspect.Parameter(name, _PLAIN, default=default,
                         annotation=CreateSpec.model_fields[name].annotation)
       for name, default in sdk_defaults().items()]
    + [inspect.Parameter("provider", _PLAIN, default=None, annotation="Provider | None")],
    return_annotation="Sandbox")


def _signature(signature: inspect.Signature) -> Callable[[F], F]:
    def give(fn: F) -> F:
        fn.__signature__ = signature  # type: ignore[attr-defined]
        return fn

    return give


def create_arguments(cls: type, *args: Any,
                     **kwargs: Any) -> tuple[dict[str, Any], Provider | None]:
    """``create()``'s arguments as the options given (by name) and a provider (a bad
    argument raises the TypeError a plain signature would, naming it); the provider
    checks the values."""
    bound = CREATE_SIGNATURE.bind(cls, *args, **kwargs)
    given = dict(bound.arguments)
    given.pop("cls")
    provider = given.pop("provider", None)
    return given, provider


def code_provider(provider: Provider) -> Provider:
    """The provider, if it has the code interpreter (a gateway may predate it)."""
    if not hasattr(provider, "run_code"):
        raise RuntimeUnavailableError(
            f"{type(provider).__name__} has no code interpreter (run_code); use the "
            "embedded engine, or run python3 through commands")
    return provider


class Sandbox:
    """A sandbox. Use ``Sandbox.create()`` or ``Sandbox.connect(id)``, not the constructor.

    As a context manager it is killed on exit, volume included: nothing is left behind.
    """

    def __init__(self, info: SandboxInfo, provider: Provider) -> None:
        self._info = info
        self._provider = provider
        self.commands = Commands(provider, info.sandbox_id)
        self.files = Files(provider, info.sandbox_id)
        self.pty = Pty(provider, info.sandbox_id)

    @classmethod
    @_signature(CREATE_SIGNATURE)
    def create(cls, *args: Any, **kwargs: Any) -> Sandbox:
        """Create and start a sandbox, with the options of ``core.spec.CreateSpec`` (its
        fields are this method's parameters, their descriptions the docs), on
        ``provider`` (default: ``default_provider()``).

        ``timeout`` is the idle time in seconds after which it is auto-paused; every use
        extends it. ``network=False`` (default) leaves only loopback. ``volume`` attaches a
        volume kept from an earlier sandbox as /workspace.
        """
        options, provider = create_arguments(cls, *args, **kwargs)
        provider = provider or default_provider()
        return cls(provider.create(**options), provider)

    @classmethod
    def connect(cls, sandbox_id: str, provider: Provider | None = None) -> Sandbox:
        provider = provider or default_provider()
        return cls(provider.info(sandbox_id), provider)

    @classmethod
    def list(cls, template: str | None = None, state: str | None = None,
             provider: Provider | None = None) -> list[SandboxInfo]:
        return (provider or default_provider()).list(template=template, state=state)

    @property
    def sandbox_id(self) -> str:
        return self._info.sandbox_id

    @property
    def template(self) -> str:
        return self._info.template

    @property
    def volume_id(self) -> str:
        """The volume mounted as /workspace (kept after ``kill()`` unless told otherwise)."""
        return self._info.volume_id

    @property
    @asks_provider
    def state(self) -> str:
        """Current state, asked afresh (the reaper may have paused it meanwhile)."""
        return self.info().state

    def info(self) -> SandboxInfo:
        self._info = self._provider.info(self.sandbox_id)
        return self._info

    def pause(self) -> None:
        self._info = self._provider.pause(self.sandbox_id)

    def resume(self) -> None:
        self._info = self._provider.resume(self.sandbox_id)

    def snapshot(self, name: str | None = None) -> SnapshotInfo:
        """Its processes, memory and files now, kept on the host: ``Sandbox.create(
        snapshot=info.snapshot_id)`` starts any number of copies of it. It runs on (it is
        stopped only for the checkpoint); connections to the outside are reset in copies."""
        return self._provider.snapshot(self.sandbox_id, name)

    @classmethod
    def list_snapshots(cls, provider: Provider | None = None) -> list[SnapshotInfo]:
        return (provider or default_provider()).list_snapshots()

    @classmethod
    def snapshot_info(cls, snapshot_id: str,
                      provider: Provider | None = None) -> SnapshotInfo:
        return (provider or default_provider()).snapshot_info(snapshot_id)

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, provider: Provider | None = None) -> None:
        (provider or default_provider()).delete_snapshot(snapshot_id)

    def reset_rootfs(self) -> None:
        """Wipe every change outside /workspace (installed packages, /etc edits...)."""
        self._info = self._provider.reset_rootfs(self.sandbox_id)

    def set_timeout(self, timeout: float) -> None:
        self._provider.set_timeout(self.sandbox_id, timeout)

    def get_metrics(self, start: float | None = None,
                    end: float | None = None) -> list[SandboxMetrics]:
        """Its CPU, memory and disk use over time (E2B's ``get_metrics``): a sample is read
        now when it runs, and those kept between ``start`` and ``end`` (Unix seconds) are
        returned, oldest first."""
        return self._provider.metrics(self.sandbox_id, start, end)

    def get_logs(self) -> list[SandboxLogEntry]:
        """Its log, oldest first (E2B's sandbox logs): what happened to it and what its
        template's start command printed, the last 1000 lines."""
        return self._provider.logs(self.sandbox_id)

    def expose_port(self, port: int, public: bool | None = None,
                    expires_in: float | None = None) -> str:
        """A URL reaching ``port`` inside the sandbox — any TCP (HTTP, WebSockets, ...),
        even with the network off: ``http://127.0.0.1:N`` locally (while this process
        lives), the gateway's routed URL (behind its API key) remotely.

        ``public=False``: a share link a browser can open (a gateway's): a revocable
        token that expires (``expires_in`` seconds, a day by default), an HttpOnly cookie
        after the first visit. ``public=True``: no token, where the operator allows it."""
        if public is None:
            return self._provider.expose_port(self.sandbox_id, port)
        return self.share_port(port, public=public, expires_in=expires_in).url

    def share_port(self, port: int, public: bool = False,
                   expires_in: float | None = None) -> PortShare:
        """A share link to ``port`` (``expose_port(port, public=...)``, with its id for
        ``revoke_share``)."""
        return self._provider.share_port(self.sandbox_id, port, public=public,
                                         expires_in=expires_in)

    def port_shares(self) -> list[PortShare]:
        """This sandbox's live share links (their tokens are not shown again)."""
        return self._provider.list_port_shares(self.sandbox_id)

    def revoke_share(self, share_id: str) -> None:
        """The share link stops working at once."""
        self._provider.revoke_port_share(self.sandbox_id, share_id)

    def get_host(self, port: int) -> str:
        """``expose_port(port)`` without its scheme (E2B's ``get_host``): prefix it with
        ``http://`` or ``ws://``."""
        return self.expose_port(port).split("://", 1)[1]

    def set_network(self, network: NetworkSpec) -> None:
        """Change what the sandbox may reach, while it runs: "off", "registries", a list
        of names (``*.`` wildcards) and CIDRs, ``{"allow_out": [...], "deny_out": [...]}``
        or "full". Connections open through the old policy are closed."""
        self._provider.set_network(self.sandbox_id, network)

    def kill(self, delete_volume: bool = False) -> None:
        """Destroy the sandbox. Its /workspace volume (``volume_id``) is kept unless
        ``delete_volume=True``: attach it to a new sandbox with
        ``Sandbox.create(volume=...)``; delete it with ``Volume.delete(volume_id)`` (or
        ``abx volume rm <id>``); ``Volume.list()`` shows the kept ones."""
        self._provider.kill(self.sandbox_id, delete_volume=delete_volume)

    def run_code(self, code: str, language: str | None = None, timeout: float | None = 60,
                 context: CodeContext | str | None = None,
                 on_stdout: Callable[[str], None] | None = None,
                 on_stderr: Callable[[str], None] | None = None,
                 on_result: Callable[[Result], None] | None = None) -> Execution:
        """Run code in a stateful Jupyter kernel (templates with a kernel, such as
        ``code-interpreter-v1``): variables persist between calls. ``language``: python
        (default), javascript, typescript, bash or r (``core/code_languages.py``), each
        with a default context of its own; or give ``context``. ``results`` holds
        display items with their formats, the last expression's value marked
        ``is_main_result``; ``error`` holds an exception raised by the code. A cell
        running past ``timeout`` seconds is interrupted (the variables are kept).
        The callbacks receive output and results while the cell runs."""
        provider = code_provider(self._provider)
        return provider.run_code(self.sandbox_id, code, language=language, timeout=timeout,
                                 context=context, on_stdout=on_stdout, on_stderr=on_stderr,
                                 on_result=on_result)

    def create_code_context(self, cwd: str | None = None, language: str | None = None,
                            user: str | None = None) -> CodeContext:
        """A new interpreter with its own variables; pass it as ``run_code(context=)``.
        ``user``: an account of the sandbox its kernel runs as (``"user"``, uid 1000,
        exists in every template; default root)."""
        # Only when given: a Provider written before ``user`` existed still works.
        extra = {} if user is None else {"user": user}
        return code_provider(self._provider).create_code_context(self.sandbox_id, cwd=cwd,
                                                                 language=language, **extra)

    def restart_code_context(self, context: CodeContext | str | None = None) -> None:
        """Restart a context's kernel (the default one if none is given): variables
        are lost."""
        code_provider(self._provider).restart_code_context(self.sandbox_id, context)

    def remove_code_context(self, context: CodeContext | str) -> None:
        """End a context's kernel and forget the context (its variables are lost)."""
        code_provider(self._provider).remove_code_context(self.sandbox_id, context)

    def list_code_contexts(self) -> list[CodeContext]:
        """The sandbox's code contexts (``default`` is listed once it has run a cell)."""
        return code_provider(self._provider).list_code_contexts(self.sandbox_id)

    def custom(self, name: str, args: list[str] | None = None) -> CommandResult:
        """Run a named command the template defines."""
        return self._provider.custom(self.sandbox_id, name, args)

    def run_command(self, name: str, args: list[str] | None = None) -> CommandResult:
        """Deprecated alias of :meth:`custom`."""
        warnings.warn("Sandbox.run_command(name) is deprecated; use sandbox.custom(name)",
                      DeprecationWarning, stacklevel=2)
        return self.custom(name, args)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill(delete_volume=True)

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, template={self.template!r})"
