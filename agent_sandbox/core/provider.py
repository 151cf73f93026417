"""The one interface between the SDK and whatever runs the sandboxes.

The embedded engine implements it directly; the remote gateway client and a cluster
provider implement the same methods, so SDK code (and the MCP server above it) never
knows which one it talks to. It lists every method the SDK calls (a test checks that the
engine and the remote provider have each, with these parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Protocol, runtime_checkable

from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import (
    CodeContext,
    CommandResult,
    DirTransfer,
    EntryInfo,
    Execution,
    FileChunks,
    FileLock,
    ProcessInfo,
    ProcessOutput,
    Result,
    SandboxInfo,
    SandboxLogEntry,
    SnapshotInfo,
    TemplateInfo,
    VolumeInfo,
)
from agent_sandbox.core.network import NetworkSpec
from agent_sandbox.core.pty import DataCallback, PtySession
from agent_sandbox.core.secrets import SecretInfo, SecretRule
from agent_sandbox.core.shares import PortShare
from agent_sandbox.core.watch import WatchStream

OutputCallback = Callable[[str], None]
ResultCallback = Callable[[Result], None]
# A command's stdin: all of it, or a stream (chunks, or a binary file such as a pipe)
# read as the command runs and never held whole.
StdinData = str | bytes | Iterable[bytes] | IO[bytes]


@runtime_checkable
class Provider(Protocol):
    # lifecycle
    def create(self, *, owner: str = "", **options: Any) -> SandboxInfo:
        """Create and start a sandbox. ``options`` are fields of ``core.spec.CreateSpec``
        by keyword; unset ones take its defaults. ``owner``: the tenant it belongs to
        (the gateway passes the API key's owner; ``SandboxInfo.owner`` reports it)."""
        ...

    def info(self, sandbox_id: str) -> SandboxInfo: ...
    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        """Live sandboxes, optionally only one tenant's."""
        ...
    def pause(self, sandbox_id: str) -> SandboxInfo: ...
    def resume(self, sandbox_id: str) -> SandboxInfo: ...
    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo: ...
    def set_timeout(self, sandbox_id: str, timeout: float) -> None: ...
    def set_network(self, sandbox_id: str, network: NetworkSpec) -> None: ...
    def expose_port(self, sandbox_id: str, port: int) -> str: ...
    # port share links (docs/ports.md): a gateway's; an engine of this host refuses them
    def share_port(self, sandbox_id: str, port: int, *, public: bool = False,
                   expires_in: float | None = None) -> PortShare: ...
    def list_port_shares(self, sandbox_id: str) -> list[PortShare]: ...
    def revoke_port_share(self, sandbox_id: str, share_id: str) -> None: ...
    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None: ...
    def metrics(self, sandbox_id: str, start: float | None = None,
                end: float | None = None) -> list[SandboxMetrics]:
        """Its resource use over time: a sample is read now (when it runs) and the
        samples kept since (``start``..``end``, Unix seconds) are returned, oldest first."""
        ...
    def logs(self, sandbox_id: str) -> list[SandboxLogEntry]:
        """Its log, oldest first: what happened to it and its start command's output
        (``service/sandbox_logs.py``; the last 1000 lines)."""
        ...

    # commands
    def run(self, sandbox_id: str, cmd: str, cwd: str | None = None,
            envs: dict[str, str] | None = None, timeout: float | None = None,
            stdin: StdinData | None = None, on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None, user: str | None = None,
            on_start: Callable[[int], None] | None = None, detach: bool = False
            ) -> CommandResult:
        """``on_start`` gets the pid once it runs. ``detach``: it outlives a caller that
        goes away (keeps running, stdin open for ``send_stdin``, no default timeout), yet
        this call gets all its output from its start (envd's Start; the embedded engine
        only)."""
        ...
    def start(self, sandbox_id: str, cmd: str, cwd: str | None = None,
              envs: dict[str, str] | None = None, user: str | None = None) -> int: ...
    def process_output(self, sandbox_id: str, pid: int) -> ProcessOutput: ...
    def wait(self, sandbox_id: str, pid: int, timeout: float | None = None,
             on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None) -> CommandResult: ...
    def kill_process(self, sandbox_id: str, pid: int, sig: int = 9) -> bool: ...
    def send_stdin(self, sandbox_id: str, pid: int, data: str | bytes,
                   close: bool = False) -> None: ...
    def processes(self, sandbox_id: str) -> list[ProcessInfo]: ...
    def custom(self, sandbox_id: str, name: str,
               args: list[str] | None = None) -> CommandResult: ...

    # code interpreter (templates with a kernel, such as code-interpreter-v1)
    def run_code(self, sandbox_id: str, code: str, language: str | None = None,
                 timeout: float | None = 60, context: str | CodeContext | None = None,
                 on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None,
                 on_result: ResultCallback | None = None) -> Execution: ...
    def create_code_context(self, sandbox_id: str, cwd: str | None = None,
                            language: str | None = None, user: str | None = None
                            ) -> CodeContext: ...
    def restart_code_context(self, sandbox_id: str,
                             context: str | CodeContext | None = None) -> None: ...
    def remove_code_context(self, sandbox_id: str, context: str | CodeContext) -> None: ...
    def list_code_contexts(self, sandbox_id: str) -> list[CodeContext]: ...

    # files
    def read_file(self, sandbox_id: str, path: str, offset: int = 0,
                  limit: int | None = None) -> FileChunks:
        """The file's chunks, and the ``version`` they were read at."""
        ...
    def write_file(self, sandbox_id: str, path: str,
                   data: bytes | str | Iterable[bytes] | IO[bytes],
                   mode: int = 0o644, user: str | None = None, *,
                   if_match: str | None = None, lock_wait: float | None = None,
                   lock_token: str | None = None, metadata: dict[str, str] | None = None
                   ) -> int:
        """A new file (and the directories made for it) belongs to ``user`` (None: root);
        a replaced one keeps its owner. One write of ours to a path at a time: it waits
        at most ``lock_wait`` s (default 3) for its turn or another holder's lock, else
        ``LockedError``; ``if_match``: only if the file is still at that version, else
        ``ConflictError``; ``lock_token``: the caller's own lock; ``metadata``: the file's
        (E2B's user.e2b.* xattrs, ``core.file_metadata``), replacing what it had."""
        ...
    def lock_file(self, sandbox_id: str, path: str, ttl: float = 60.0, *,
                  holder: str | None = None, wait: float | None = None,
                  token: str | None = None) -> FileLock:
        """Lock a file for ``ttl`` seconds (renew with its ``token``): writes without the
        token get ``LockedError`` until it is unlocked, expires or its holder ends."""
        ...
    def unlock_file(self, sandbox_id: str, path: str, token: str) -> None: ...
    def release_locks(self, sandbox_id: str, holder: str) -> int:
        """Release every lock ``holder`` has in the sandbox; how many."""
        ...
    def list_files(self, sandbox_id: str, path: str, depth: int = 1) -> list[EntryInfo]: ...
    def stat(self, sandbox_id: str, path: str) -> EntryInfo: ...
    def exists(self, sandbox_id: str, path: str) -> bool: ...
    def make_dir(self, sandbox_id: str, path: str, user: str | None = None) -> None: ...
    def remove(self, sandbox_id: str, path: str) -> None: ...
    def rename(self, sandbox_id: str, src: str, dst: str) -> None: ...
    def watch_dir(self, sandbox_id: str, path: str, recursive: bool = False,
                  timeout: float | None = None) -> WatchStream:
        """A directory's changes, from when this returns until ``close()`` (or
        ``timeout`` seconds; None: no end)."""
        ...

    def read_dir_archive(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        """A directory as tar chunks, made in the sandbox: hostile (``files.download_dir``
        extracts them with ``guest.dir_unpack``)."""
        ...
    def write_dir_archive(self, sandbox_id: str, path: str,
                          data: Iterable[bytes] | IO[bytes],
                          user: str | None = None) -> DirTransfer:
        """Extract a tar stream into a directory of the sandbox (made if missing); what it
        makes belongs to ``user`` (None: root), a file it replaces keeps its owner."""
        ...
    # terminals (see pty_session)
    def pty_open(self, sandbox_id: str, pid: int | None = None, *, cols: int = 80,
                 rows: int = 24, cwd: str | None = None, envs: dict[str, str] | None = None,
                 cmd: str | None = None, on_data: DataCallback | None = None,
                 user: str | None = None) -> PtySession:
        """A new terminal running ``cmd`` (default: a login shell), or with ``pid`` the
        running one of that pid (its recent output first)."""
        ...
    def pty_kill(self, sandbox_id: str, pid: int, sig: int = 9) -> bool: ...

    # templates and volumes
    def list_templates(self) -> list[TemplateInfo]: ...
    def list_volumes(self) -> list[VolumeInfo]: ...
    def delete_volume(self, volume_id: str) -> None: ...

    # secrets (docs/secrets.md): values go in, never come out
    def create_secret(self, rule: SecretRule | dict[str, Any], value: str, *,
                      replace: bool = False, owner: str = "") -> SecretInfo: ...
    def list_secrets(self, owner: str = "") -> list[SecretInfo]: ...
    def delete_secret(self, name: str, owner: str = "") -> None: ...
    # memory snapshots (create(snapshot=...) starts a sandbox from one)
    def snapshot(self, sandbox_id: str, name: str | None = None, *,
                 owner: str = "") -> SnapshotInfo: ...
    def list_snapshots(self, owner: str | None = None) -> list[SnapshotInfo]: ...
    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo: ...
    def delete_snapshot(self, snapshot_id: str) -> None: ...

    # the host
    def disk_headroom(self) -> dict[str, int] | None:
        """Free bytes where sandboxes live and the reserve kept (None: not this host's)."""
        ...
