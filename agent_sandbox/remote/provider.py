"""``RemoteProvider``: every Provider method as a call to a sandbox gateway (``abx serve``).

Errors come back as the same exception classes the embedded engine raises, so SDK code
behaves the same against either.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import IO, Any
from urllib.parse import quote

import httpx2 as httpx

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError, SandboxError, error_from_code
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
from agent_sandbox.core.provider import OutputCallback, ResultCallback, StdinData
from agent_sandbox.core.pty import DataCallback, PtySession
from agent_sandbox.core.secrets import SecretInfo, SecretRule
from agent_sandbox.core.secrets import check_name as check_secret_name
from agent_sandbox.core.shares import PortShare
from agent_sandbox.core.spec import known_names
from agent_sandbox.remote import templates as recipe_builds
from agent_sandbox.remote.transport import Transport, iter_bytes
from agent_sandbox.remote.watch import RemoteWatch

_CHUNK = 1 << 20


def _validate() -> ModuleType:
    """The engine's input checks (ids, numbers), imported on first use: a process that
    only imports the SDK or builds a client loads nothing of ``agent_sandbox.backends``."""
    from agent_sandbox.core import validate

    return validate


def _no_owner(owner: object) -> None:
    """Through a gateway the tenant is the API key's owner, never the caller's word."""
    if owner:
        raise InvalidArgumentError("owner is decided by the gateway from your API key; "
                                   "do not pass it to a remote provider")


def _stdin_fields(data: str | bytes | None, key: str = "stdin") -> dict[str, Any]:
    if data is None:
        return {}
    if isinstance(data, str):
        return {key: data}
    if isinstance(data, bytes | bytearray | memoryview):
        return {f"{key}_base64": base64.b64encode(bytes(data)).decode()}
    return {key: data}  # let the gateway reject it with the engine's message


def _network_field(network: object) -> Any:
    """A policy as the gateway's JSON: checked here first (the SDK's own message, no round
    trip), and plain true/false where that says it all, which any gateway takes."""
    from agent_sandbox.core.network import compact, parse

    return compact(parse(network))


def _user_field(user: str | None) -> dict[str, Any]:
    # Sent only when given: a gateway from before ``user`` existed still runs the rest.
    return {} if user is None else {"user": user}


def _body_chunks(data: bytes | str | Iterable[bytes] | IO[bytes]) -> bytes | Iterator[bytes]:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if hasattr(data, "read"):
        reader = data

        def from_file() -> Iterator[bytes]:
            while chunk := reader.read(_CHUNK):  # type: ignore[union-attr]
                yield chunk.encode() if isinstance(chunk, str) else chunk

        return from_file()
    return (bytes(c) for c in data)  # type: ignore[union-attr]


class RemoteProvider:
    def __init__(self, base_url: str, api_key: str | None = None, *,
                 retry_seconds: float | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        kw: dict[str, Any] = {"transport": transport}
        if retry_seconds is not None:
            kw["retry_seconds"] = retry_seconds
        self.base_url = base_url
        self._http = Transport(base_url, api_key, **kw)

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"RemoteProvider({self.base_url!r})"

    # urls -------------------------------------------------------------------------------
    @staticmethod
    def _sb(sandbox_id: str, tail: str = "") -> str:
        # Checked here too: an id like "sbx-../x" must never become a different URL.
        return f"/v1/sandboxes/{_validate().sandbox_id(sandbox_id)}{tail}"

    def _call(self, method: str, url: str, **kw: Any) -> Any:
        return self._http.request(method, url, **kw)

    # lifecycle --------------------------------------------------------------------------
    def create(self, *, owner: str = "", **options: Any) -> SandboxInfo:
        _no_owner(owner)
        # Checked once, by the gateway; names here (a TypeError before anything is sent).
        body = dict(known_names(options))
        if "network" in body:
            body["network"] = _network_field(body["network"])
        return SandboxInfo(**self._call("POST", "/v1/sandboxes", json=body))

    def info(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo(**self._call("GET", self._sb(sandbox_id)))

    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        _no_owner(owner)
        params = {k: v for k, v in (("template", template), ("state", state)) if v is not None}
        return [SandboxInfo(**s) for s in self._call("GET", "/v1/sandboxes", params=params)]

    def metrics(self, sandbox_id: str, start: float | None = None,
                end: float | None = None) -> list[SandboxMetrics]:
        found = self._call("GET", self._sb(sandbox_id, "/metrics"), params={
            k: v for k, v in (("start", start), ("end", end)) if v is not None})
        return [SandboxMetrics(**m) for m in found]

    def logs(self, sandbox_id: str) -> list[SandboxLogEntry]:
        return [SandboxLogEntry(**e) for e in self._call("GET", self._sb(sandbox_id, "/logs"))]

    def pause(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo(**self._call("POST", self._sb(sandbox_id, "/pause")))

    def resume(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo(**self._call("POST", self._sb(sandbox_id, "/resume")))

    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo:
        return SandboxInfo(**self._call("POST", self._sb(sandbox_id, "/reset-rootfs"),
                                        replayable=False))

    def set_timeout(self, sandbox_id: str, timeout: float) -> None:
        self._call("PUT", self._sb(sandbox_id, "/timeout"), json={"timeout": timeout})

    def set_network(self, sandbox_id: str, network: object) -> None:
        self._call("PUT", self._sb(sandbox_id, "/network"),
                   json={"network": _network_field(network)})

    def expose_port(self, sandbox_id: str, port: int) -> str:
        from agent_sandbox.core.validate import port as check_port

        check_port(port)
        self.info(sandbox_id)  # a clear not-found here, not at the first request
        return f"{self.base_url.rstrip('/')}{self._sb(sandbox_id, f'/ports/{port}')}"

    def share_port(self, sandbox_id: str, port: int, *, public: bool = False,
                   expires_in: float | None = None) -> PortShare:
        body: dict[str, Any] = {"port": port, "public": public}
        if expires_in is not None:
            body["expires_in"] = expires_in
        return PortShare(**self._call("POST", self._sb(sandbox_id, "/shares"), json=body))

    def list_port_shares(self, sandbox_id: str) -> list[PortShare]:
        return [PortShare(**s) for s in self._call("GET", self._sb(sandbox_id, "/shares"))]

    def revoke_port_share(self, sandbox_id: str, share_id: str) -> None:
        if not isinstance(share_id, str) or not share_id.replace("-", "").isalnum():
            raise error_from_code("not_found", f"share link {share_id!r} not found")
        self._call("DELETE", self._sb(sandbox_id, f"/shares/{share_id}"))

    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None:
        self._call("DELETE", self._sb(sandbox_id),
                   params={"delete_volumes": "true" if delete_volume else "false"})

    # commands ---------------------------------------------------------------------------
    def _events(self, url: str, body: dict[str, Any], last: str,
                on_event: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """NDJSON: events as they happen (to ``on_event``), then the ``last`` one (or an
        error event, raised as its exception class)."""
        outcome: dict[str, Any] = {}

        def each(event: dict[str, Any]) -> None:
            if last in event or "error" in event:
                outcome.update(event)
            else:
                on_event(event)

        self._http.ndjson("POST", url, each, json={**body, "stream": True})
        if "error" in outcome:
            err = outcome["error"]
            raise error_from_code(err.get("code", "internal"), err.get("message", ""),
                                  err.get("details"))
        if last not in outcome:
            raise SandboxError(f"the gateway ended the stream without a {last} event")
        return outcome[last]

    def _streamed(self, url: str, body: dict[str, Any], on_stdout: OutputCallback | None,
                  on_stderr: OutputCallback | None) -> CommandResult:
        def on_event(event: dict[str, Any]) -> None:
            if "stdout" in event and on_stdout:
                on_stdout(event["stdout"])
            elif "stderr" in event and on_stderr:
                on_stderr(event["stderr"])

        return CommandResult(**self._events(url, body, "result", on_event))

    def run(self, sandbox_id: str, cmd: str, cwd: str | None = None,
            envs: dict[str, str] | None = None, timeout: float | None = None,
            stdin: StdinData | None = None, on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None, user: str | None = None,
            on_start: Callable[[int], None] | None = None, detach: bool = False
            ) -> CommandResult:
        if on_start is not None or detach:
            raise InvalidArgumentError("on_start and detach are served by the embedded "
                                       "engine only (the gateway's E2B API uses them)")
        if stdin is not None and not isinstance(stdin, str | bytes | bytearray | memoryview):
            from agent_sandbox.remote.stdin_run import run_fed

            return run_fed(self, sandbox_id, cmd, cwd=cwd, envs=envs, timeout=timeout,
                           stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr, user=user)
        url = self._sb(sandbox_id, "/commands")
        body = {"cmd": cmd, "cwd": cwd, "envs": envs, "timeout": timeout,
                **_stdin_fields(stdin), **_user_field(user)}
        if on_stdout or on_stderr:
            return self._streamed(url, body, on_stdout, on_stderr)
        return CommandResult(**self._call("POST", url, json=body, replayable=False))

    def start(self, sandbox_id: str, cmd: str, cwd: str | None = None,
              envs: dict[str, str] | None = None, user: str | None = None) -> int:
        body = {"cmd": cmd, "cwd": cwd, "envs": envs, **_user_field(user)}
        return int(self._call("POST", self._sb(sandbox_id, "/processes"), json=body,
                              replayable=False)["pid"])

    def _proc(self, sandbox_id: str, pid: int, tail: str) -> str:
        if isinstance(pid, bool) or not isinstance(pid, int):
            _validate().positive(pid, "pid", allow_none=False, integer=True)
        return self._sb(sandbox_id, f"/processes/{int(pid)}{tail}")

    def process_output(self, sandbox_id: str, pid: int) -> ProcessOutput:
        return ProcessOutput(**self._call("GET", self._proc(sandbox_id, pid, "/output")))

    def wait(self, sandbox_id: str, pid: int, timeout: float | None = None,
             on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None) -> CommandResult:
        url = self._proc(sandbox_id, pid, "/wait")
        body = {"timeout": timeout}
        if on_stdout or on_stderr:
            return self._streamed(url, body, on_stdout, on_stderr)
        return CommandResult(**self._call("POST", url, json=body))

    def kill_process(self, sandbox_id: str, pid: int, sig: int = signal.SIGKILL) -> bool:
        return bool(self._call("POST", self._proc(sandbox_id, pid, "/kill"),
                               json={"signal": int(sig)})["killed"])

    def send_stdin(self, sandbox_id: str, pid: int, data: str | bytes,
                   close: bool = False) -> None:
        self._call("POST", self._proc(sandbox_id, pid, "/stdin"),
                   json={**_stdin_fields(data, "data"), "close": close}, replayable=False)

    def processes(self, sandbox_id: str) -> list[ProcessInfo]:
        return [ProcessInfo(**p) for p in self._call("GET", self._sb(sandbox_id, "/processes"))]

    def custom(self, sandbox_id: str, name: str,
               args: list[str] | None = None) -> CommandResult:
        if not isinstance(name, str) or not name or "/" in name:
            raise error_from_code("not_found", f"no custom command {name!r}")
        url = self._sb(sandbox_id, f"/custom/{quote(name, safe='')}")
        return CommandResult(**self._call("POST", url, json={"args": args}, replayable=False))

    # code interpreter -------------------------------------------------------------------
    def run_code(self, sandbox_id: str, code: str, language: str | None = None,
                 timeout: float | None = 60, context: str | CodeContext | None = None,
                 on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None,
                 on_result: ResultCallback | None = None) -> Execution:
        if not isinstance(code, str):
            raise InvalidArgumentError("code must be a string")
        url = self._sb(sandbox_id, "/code")
        body = {"code": code, "language": language, "timeout": timeout,
                "context": _validate().code_context(context)}
        if not (on_stdout or on_stderr or on_result):
            return Execution(**self._call("POST", url, json=body, replayable=False))
        results: list[Result] = []

        def on_event(event: dict[str, Any]) -> None:
            if "stdout" in event and on_stdout:
                on_stdout(event["stdout"])
            elif "stderr" in event and on_stderr:
                on_stderr(event["stderr"])
            elif "result" in event:
                result = Result(**event["result"])
                results.append(result)
                if on_result:
                    on_result(result)

        summary = Execution(**self._events(url, body, "execution", on_event))
        summary.results = results  # sent as events, not again in the summary
        return summary

    def create_code_context(self, sandbox_id: str, cwd: str | None = None,
                            language: str | None = None, user: str | None = None
                            ) -> CodeContext:
        body = {"cwd": cwd, "language": language, **_user_field(user)}
        return CodeContext(**self._call("POST", self._sb(sandbox_id, "/code/contexts"),
                                        json=body, replayable=False))

    def restart_code_context(self, sandbox_id: str,
                             context: str | CodeContext | None = None) -> None:
        # Checked here too: an id with a "/" would be another URL (a 404), not "invalid".
        ctx = _validate().code_context(context)
        self._call("POST", self._sb(sandbox_id, f"/code/contexts/{ctx}/restart"),
                   replayable=False)

    def remove_code_context(self, sandbox_id: str, context: str | CodeContext) -> None:
        ctx = _validate().code_context(context)
        self._call("DELETE", self._sb(sandbox_id, f"/code/contexts/{ctx}"), replayable=False)

    def list_code_contexts(self, sandbox_id: str) -> list[CodeContext]:
        return [CodeContext(**c) for c in self._call("GET", self._sb(sandbox_id,
                                                                     "/code/contexts"))]

    # files ------------------------------------------------------------------------------
    def read_file(self, sandbox_id: str, path: str, offset: int = 0,
                  limit: int | None = None) -> Iterator[bytes]:
        params: dict[str, Any] = {"path": path, "offset": offset}
        if limit is not None:
            params["limit"] = limit
        # Opened now, so a missing file raises here, as it does locally.
        response = self._http.open_stream("GET", self._sb(sandbox_id, "/files/content"),
                                          params=params)
        etag = response.headers.get("etag")
        return FileChunks(iter_bytes(response), etag.strip('"') if etag else None)

    def write_file(self, sandbox_id: str, path: str,
                   data: bytes | str | Iterable[bytes] | IO[bytes],
                   mode: int = 0o644, user: str | None = None, *,
                   if_match: str | None = None, lock_wait: float | None = None,
                   lock_token: str | None = None, metadata: dict[str, str] | None = None
                   ) -> int:
        content = _body_chunks(data)
        params: dict[str, Any] = {"path": path, "mode": mode}
        for key, value in (("user", user), ("if_match", if_match), ("lock_wait", lock_wait)):
            if value is not None:
                params[key] = value
        headers = {"Content-Type": "application/octet-stream"}
        if lock_token is not None:  # a header: never in an access log's URL
            headers["X-Abx-Lock-Token"] = lock_token
        for key, value in (validate.file_metadata(metadata) or {}).items():
            headers[f"X-Metadata-{key}"] = value
        # A stream cannot be sent twice: only a bytes body is retried.
        return int(self._call("PUT", self._sb(sandbox_id, "/files/content"), params=params,
                              content=content, replayable=isinstance(content, bytes),
                              headers=headers)["size"])

    def lock_file(self, sandbox_id: str, path: str, ttl: float = 60.0, *,
                  holder: str | None = None, wait: float | None = None,
                  token: str | None = None) -> FileLock:
        body = {k: v for k, v in (("path", path), ("ttl", ttl), ("holder", holder),
                                  ("wait", wait), ("token", token)) if v is not None}
        return FileLock(**self._call("POST", self._sb(sandbox_id, "/files/lock"), json=body,
                                     replayable=False))

    def unlock_file(self, sandbox_id: str, path: str, token: str) -> None:
        self._call("POST", self._sb(sandbox_id, "/files/unlock"),
                   json={"path": path, "token": token})

    def release_locks(self, sandbox_id: str, holder: str) -> int:
        return int(self._call("DELETE", self._sb(sandbox_id, "/files/locks"),
                              params={"holder": holder})["released"])

    def list_files(self, sandbox_id: str, path: str, depth: int = 1) -> list[EntryInfo]:
        entries = self._call("GET", self._sb(sandbox_id, "/files"),
                             params={"path": path, "depth": depth})
        return [EntryInfo(**e) for e in entries]

    def stat(self, sandbox_id: str, path: str) -> EntryInfo:
        return EntryInfo(**self._call("GET", self._sb(sandbox_id, "/files/stat"),
                                      params={"path": path}))

    def exists(self, sandbox_id: str, path: str) -> bool:
        return bool(self._call("GET", self._sb(sandbox_id, "/files/exists"),
                               params={"path": path})["exists"])

    def make_dir(self, sandbox_id: str, path: str, user: str | None = None) -> None:
        body = {"path": path} if user is None else {"path": path, "user": user}
        self._call("POST", self._sb(sandbox_id, "/files/mkdir"), json=body)

    def remove(self, sandbox_id: str, path: str) -> None:
        self._call("DELETE", self._sb(sandbox_id, "/files"), params={"path": path})

    def rename(self, sandbox_id: str, src: str, dst: str) -> None:
        self._call("POST", self._sb(sandbox_id, "/files/rename"),
                   json={"src": src, "dst": dst}, replayable=False)

    def watch_dir(self, sandbox_id: str, path: str, recursive: bool = False,
                  timeout: float | None = None) -> RemoteWatch:
        if not isinstance(recursive, bool):
            raise InvalidArgumentError(f"recursive must be true or false, got {recursive!r}")
        params: dict[str, Any] = {"path": path, "recursive": "true" if recursive else "false"}
        if timeout is not None:
            params["timeout"] = timeout
        return RemoteWatch(self._http.open_stream("GET", self._sb(sandbox_id, "/files/watch"),
                                                  params=params))

    def read_dir_archive(self, sandbox_id: str, path: str) -> Iterator[bytes]:
        # Opened now, so a missing directory raises here, as it does locally.
        response = self._http.open_stream("GET", self._sb(sandbox_id, "/files/archive"),
                                          params={"path": path})
        return iter_bytes(response)

    def write_dir_archive(self, sandbox_id: str, path: str,
                          data: Iterable[bytes] | IO[bytes],
                          user: str | None = None) -> DirTransfer:
        user = _validate().user(user)  # before a byte of the archive is sent
        content = _body_chunks(data)
        params = {"path": path, **({"user": user} if user is not None else {})}
        return DirTransfer(**self._call("PUT", self._sb(sandbox_id, "/files/archive"),
                                        params=params, content=content,
                                        replayable=isinstance(content, bytes),
                                        headers={"Content-Type": "application/x-tar"}))

    # terminals --------------------------------------------------------------------------
    def pty_open(self, sandbox_id: str, pid: int | None = None, *, cols: int = 80,
                 rows: int = 24, cwd: str | None = None, envs: dict[str, str] | None = None,
                 cmd: str | None = None, on_data: DataCallback | None = None,
                 user: str | None = None) -> PtySession:
        from agent_sandbox.remote.pty import open_remote_pty

        first: dict[str, Any] = {"pid": pid} if pid is not None else {
            "cols": cols, "rows": rows, "cwd": cwd, "envs": envs, "cmd": cmd, "user": user}
        return open_remote_pty(self._http, self._sb(sandbox_id, "/pty"), first, on_data,
                               lambda pid, sig: self.pty_kill(sandbox_id, pid, sig))

    def pty_kill(self, sandbox_id: str, pid: int, sig: int = 9) -> bool:
        if isinstance(pid, bool) or not isinstance(pid, int):
            _validate().positive(pid, "pid", allow_none=False, integer=True)
        return bool(self._call("POST", self._sb(sandbox_id, f"/pty/{int(pid)}/kill"),
                               json={"signal": int(sig)})["killed"])

    # templates and volumes --------------------------------------------------------------
    build_recipe = recipe_builds.build_recipe  # POST /v1/templates (remote/templates.py)
    def list_templates(self) -> list[TemplateInfo]:
        return [TemplateInfo(**t) for t in self._call("GET", "/v1/templates")]

    def list_volumes(self) -> list[VolumeInfo]:
        return [VolumeInfo(**v) for v in self._call("GET", "/v1/volumes")]

    def delete_volume(self, volume_id: str) -> None:
        if not isinstance(volume_id, str) or not volume_id or "/" in volume_id:
            raise error_from_code("not_found", f"volume {volume_id!r} not found")
        self._call("DELETE", f"/v1/volumes/{quote(volume_id, safe='')}")

    # secrets ------------------------------------------------------------------------------
    def create_secret(self, rule: SecretRule | dict[str, Any], value: str, *,
                      replace: bool = False, owner: str = "") -> SecretInfo:
        _no_owner(owner)
        rule = rule if isinstance(rule, SecretRule) else SecretRule(**rule)
        body = {**rule.model_dump(mode="json"), "value": value, "replace": replace}
        return SecretInfo(**self._call("POST", "/v1/secrets", json=body))

    def list_secrets(self, owner: str = "") -> list[SecretInfo]:
        _no_owner(owner)
        return [SecretInfo(**s) for s in self._call("GET", "/v1/secrets")]

    def delete_secret(self, name: str, owner: str = "") -> None:
        _no_owner(owner)
        self._call("DELETE", f"/v1/secrets/{quote(check_secret_name(name), safe='')}")
    def snapshot(self, sandbox_id: str, name: str | None = None, *,
                 owner: str = "") -> SnapshotInfo:
        _no_owner(owner)
        return SnapshotInfo(**self._call("POST", self._sb(sandbox_id, "/snapshots"),
                                         json={"name": name}))

    def list_snapshots(self, owner: str | None = None) -> list[SnapshotInfo]:
        return [SnapshotInfo(**s) for s in self._call("GET", "/v1/snapshots")]

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return SnapshotInfo(**self._call("GET", f"/v1/snapshots/{self._snap(snapshot_id)}"))

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._call("DELETE", f"/v1/snapshots/{self._snap(snapshot_id)}")

    @staticmethod
    def _snap(snapshot_id: str) -> str:
        return quote(_validate().snapshot_id(snapshot_id), safe="")

    def disk_headroom(self) -> dict[str, int] | None:
        return None  # the gateway's host: its /metrics shows it
