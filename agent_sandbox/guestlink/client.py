"""Host-side client of the in-sandbox guest agent (``agent_sandbox/guest/agent.py``):
its typed calls.

Every method opens its own connection (unix socket or TCP), sends one request and reads
the reply frames, so a single ``GuestClient`` is safe to share between threads. What
the guest sends is hostile input; ``guest_channel`` bounds every frame and deadline,
``guest_streams`` keeps the output and file streams bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from agent_sandbox.core.cancel import current as current_call
from agent_sandbox.guest import ops
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink.channel import (
    MAX_CALL_FRAMES,
    MAX_ERROR_TEXT,
    MAX_REPLY_JSON,
    Address,
    Cancel,
    GuestConnection,
    GuestProtocolError,
    GuestUnavailableError,
    connect,
    field,
    payload_chunks,
)
from agent_sandbox.guestlink.streams import (
    ExecResult,
    OutputCallback,
    OutputTail,
    ProcOutput,
    ReadStream,
    collect_output,
    feed_stdin,
)
from agent_sandbox.guestlink.watch import GuestWatch

__all__ = [
    "MAX_CALL_FRAMES", "MAX_ERROR_TEXT", "MAX_REPLY_JSON", "Address", "Cancel",
    "ExecResult", "GuestClient", "GuestProtocolError", "GuestUnavailableError",
    "DEFAULT_IO_TIMEOUT", "OutputCallback", "ProcOutput", "STREAM_GRACE", "field",
]

DEFAULT_IO_TIMEOUT = 60.0
LOCK_WAIT_DEFAULT = 3.0  # the guest's wait for a write's turn when the call gives none
LOCK_GRACE = 10.0  # a lock call waits this much past its own wait for the guest's answer
STREAM_GRACE = 30.0  # extra time granted on top of a command timeout before giving up


class GuestClient:
    """Blocking client; one connection per call."""

    def __init__(
        self,
        address: Address,
        token: str | None = None,
        connect_timeout: float = 5.0,
        io_timeout: float | None = DEFAULT_IO_TIMEOUT,
    ) -> None:
        self.address = address
        self.token = token
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout

    # ------------------------------------------------------------ plumbing
    def _open(self, req: dict[str, Any], total: Any = ..., *,
              frame_timeout: Any = ...) -> GuestConnection:
        """Connect, authenticate and send the request frame. ``total`` bounds the whole
        call, ``frame_timeout`` each frame; both default to the client's io_timeout."""
        conn = connect(self.address, self.connect_timeout, str(req["op"]))
        try:
            conn.limit(self.io_timeout if frame_timeout is ... else frame_timeout,
                       self.io_timeout if total is ... else total)
            if self.token is not None:  # pipelined: the guest does not answer hello
                conn.send({"op": ops.HELLO, "token": self.token})
            conn.send(req)
        except BaseException:
            conn.close()
            raise
        return conn

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        conn = self._open(req)
        try:
            return conn.final()
        finally:
            conn.close()

    # ------------------------------------------------------------ processes
    def ping(self) -> dict[str, Any]:
        reply = self._call({"op": ops.PING})
        reply.pop("done", None)
        return reply

    def ping_within(self, seconds: float) -> None:
        """One ping that may wait up to ``seconds`` for the guest to answer (it may still
        be starting: a host-made listener accepts the connection before the guest does)."""
        conn = self._open({"op": ops.PING}, seconds, frame_timeout=seconds)
        try:
            conn.final()
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 10.0, interval: float = 0.005) -> dict[str, Any]:
        """Ping until the guest answers; for callers that just started the sandbox."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.ping()
            except GuestUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(interval)

    def exec(
        self,
        argv: Iterable[str],
        *,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = 1 << 20,
        stdin: bytes | Iterable[bytes] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: Cancel | None = None,
        user: str | None = None,
        on_start: Callable[[int], None] | None = None,
        detach: bool = False,
        stdin_open: bool = False,
    ) -> ExecResult:
        """Run a command to completion, streaming output to the callbacks as it arrives
        (or until ``cancel`` ends it: the guest kills the command). ``user``: an account
        of the sandbox to run it as (default root). ``on_start`` gets its pid once it
        runs. ``detach``: it outlives this call (a background process, followed from its
        start; ``cancel`` then only stops following); ``stdin_open``: its stdin stays open for
        ``send_stdin``."""
        req = {
            "op": ops.EXEC,
            "argv": list(argv),
            "cwd": cwd,
            "env": env,
            "timeout": timeout,
            "max_output": max_output,
            "stdin": stdin is not None or stdin_open,
            "background": detach,
            "follow": detach,
            # A cancellable caller shuts the connection down to stop it: the guest watches.
            "watch": cancel is not None or current_call() is not None,
            **({"user": user} if user is not None else {}),
        }
        total = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open(req, total, frame_timeout=total)
        if cancel is not None:
            cancel.bind(conn.sock)
        feeder: threading.Thread | None = None
        try:
            started, _ = conn.recv()
            pid = field(started, "pid", int)
            if on_start is not None:
                on_start(pid)
            if stdin is not None:
                feeder = threading.Thread(target=feed_stdin, args=(conn, stdin), daemon=True)
                feeder.start()
            return collect_output(conn, pid, max_output, on_stdout, on_stderr)
        finally:
            conn.close()
            if feeder is not None:
                feeder.join(1.0)

    def start(
        self,
        argv: Iterable[str],
        *,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        max_output: int = 1 << 20,
        stdin_open: bool = False,
        user: str | None = None,
    ) -> int:
        """Start a background process; it outlives this call. Returns its pid."""
        reply = self._call(
            {
                "op": ops.EXEC,
                "argv": list(argv),
                "cwd": cwd,
                "env": env,
                "max_output": max_output,
                "stdin": stdin_open,
                "background": True,
                **({"user": user} if user is not None else {}),
            }
        )
        return int(field(reply, "pid", int))

    def output(self, pid: int, max_output: int = 1 << 20) -> ProcOutput:
        """Output buffered so far (the tail of max_output bytes per stream)."""
        conn = self._open({"op": ops.OUTPUT, "pid": pid})
        out, err = OutputTail(max_output), OutputTail(max_output)
        budget = 2 * max_output + 4 * proto.CHUNK  # what an honest guest's tails can be
        try:
            while True:
                obj, payload = conn.recv()
                if obj.get("done"):
                    break
                budget -= len(payload) + 1
                if budget < 0:
                    raise GuestProtocolError("guest sent more output than it may buffer")
                (out if obj.get("stream") == "stdout" else err).add(payload)
        finally:
            conn.close()
        split = field(obj, "stdout_len", int, 0)
        out.add(payload[:split])
        err.add(payload[split:])
        return ProcOutput(
            stdout=bytes(out.buf),
            stderr=bytes(err.buf),
            running=field(obj, "running", bool),
            exit_code=field(obj, "exit_code", (int, type(None)), None),
            truncated=out.dropped or err.dropped or bool(obj.get("truncated")),
        )

    def wait(
        self,
        pid: int,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        *,
        max_output: int = 1 << 20,
    ) -> ExecResult:
        """Stream buffered then live output until the process ends or timeout passes.

        A timeout only stops waiting: the result has timed_out=True and exit_code=-1 if the
        process is still running.
        """
        total = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open({"op": ops.WAIT, "pid": pid, "timeout": timeout}, total,
                          frame_timeout=total)
        try:
            return collect_output(conn, pid, max_output, on_stdout, on_stderr)
        finally:
            conn.close()

    def kill(self, pid: int, signal: int = 9) -> bool:
        """Signal the process group; False if the process had already finished."""
        return field(self._call({"op": ops.KILL, "pid": pid, "signal": signal}), "killed", bool)

    def send_stdin(self, pid: int, data: bytes, close: bool = False) -> None:
        """Write to a background process started with stdin_open=True."""
        conn = self._open({"op": ops.STDIN, "pid": pid})
        try:
            conn.recv()  # "ready", or the guest's error (unknown pid, no stdin)
            try:
                for chunk in payload_chunks(data):
                    conn.send({}, chunk)
                conn.send({"close": True} if close else {"eof": True})
            except GuestUnavailableError as exc:
                conn.recv_after_send_failure(exc)
            conn.final()
        finally:
            conn.close()

    def ps(self) -> list[dict[str, Any]]:
        return field(self._call({"op": ops.PS}), "processes", list)

    def freeze(self) -> None:
        """Stop every process but the guest; new ones are refused until ``thaw``
        (the rootless engine's pause: no cgroup freezer without root)."""
        self._call({"op": ops.FREEZE})

    def park(self) -> None:
        """Before a checkpoint: the guest closes every connection and its listener, and
        waits for the restore to hand it a new one (``guest.server.park``)."""
        self._call({"op": ops.PARK})

    def thaw(self) -> None:
        self._call({"op": ops.THAW})

    # ------------------------------------------------------------ files
    def read(self, path: str, offset: int = 0, limit: int | None = None) -> Iterator[bytes]:
        """Stream a file in chunks. Errors such as not_found are raised here, at call time."""
        return self._read_stream({"op": ops.READ, "path": path, "offset": offset,
                                  "limit": limit})

    def write(
        self,
        path: str,
        data: bytes | Iterable[bytes] | BinaryIO,
        mode: int = 0o644,
        append: bool = False,
        user: str | None = None,
        *,
        if_match: str | None = None,
        lock_wait: float | None = None,
        lock_token: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> int:
        """Upload a file (atomically replaced unless append). Returns bytes written. A new
        file, and the directories made for it, belong to ``user`` (None: root).

        The guest lets one write of ours to a path in at a time, and none past another
        holder's lock (``lock_token`` names the caller's own): it waits at most
        ``lock_wait`` seconds (None: its default, 3) for its turn, else ``LockedError``.
        ``if_match``: only if the file is still at that version, else ``ConflictError``.
        ``metadata``: the file's user.e2b.* xattrs (the only ones it keeps; None with
        ``append``: the file's stay)."""
        req: dict[str, Any] = {"op": ops.WRITE, "path": path, "mode": mode, "append": append,
                               "user": user}
        for key, value in (("if_match", if_match), ("lock_wait", lock_wait),
                           ("lock_token", lock_token), ("metadata", metadata)):
            if value is not None:
                req[key] = value
        # The guest answers "ready" once the file's turn came: at most the wait, never
        # longer than that (and a grace) for a guest that keeps us waiting.
        wait = LOCK_WAIT_DEFAULT if lock_wait is None else lock_wait
        return int(field(self._send_stream(req, data, ready_within=wait + LOCK_GRACE),
                         "size", int))

    def lock(self, path: str, ttl: float, holder: str, *, wait: float = 0.0,
             token: str | None = None) -> dict[str, Any]:
        """Take the explicit lock on ``path`` for ``ttl`` seconds for ``holder`` (or renew
        the one ``token`` names), waiting at most ``wait`` s for another's to end. The
        answer (token, holder, expires_in) is the guest's: unchecked here."""
        req: dict[str, Any] = {"op": ops.LOCK, "path": path, "ttl": ttl, "holder": holder,
                               "lock_wait": wait}
        if token is not None:
            req["lock_token"] = token
        conn = self._open(req, wait + LOCK_GRACE, frame_timeout=wait + LOCK_GRACE)
        try:
            return conn.final()
        finally:
            conn.close()

    def unlock(self, path: str, token: str) -> None:
        self._call({"op": ops.UNLOCK, "path": path, "lock_token": token})

    def unlock_holder(self, holder: str) -> int:
        """Release every lock ``holder`` has in this sandbox; how many there were."""
        return int(field(self._call({"op": ops.UNLOCK, "holder": holder}), "released", int))

    def read_tar(self, path: str) -> ReadStream:
        """Stream the directory ``path`` as a tar archive, in chunks (made by the guest's
        ``dir_pack``: hostile data, to be read with ``dir_unpack``). Errors such as
        not_found are raised here, at call time."""
        return self._read_stream({"op": ops.TAR_OUT, "path": path})

    def write_tar(self, path: str, data: Iterable[bytes] | BinaryIO,
                  user: str | None = None) -> dict[str, Any]:
        """Extract a tar stream into the directory ``path`` (made if missing); what it
        makes belongs to ``user`` (None: root), a file it replaces keeps its owner.
        Returns the guest's summary (counts and skipped entries), unchecked."""
        req = {"op": ops.TAR_IN, "path": path, **({"user": user} if user is not None else {})}
        return self._send_stream(req, data)

    def _read_stream(self, req: dict[str, Any]) -> ReadStream:
        """Send ``req`` and stream the chunks it answers with; the first is read now, so
        errors (not_found) are raised at call time."""
        conn = self._open(req, None)
        try:
            first = conn.recv()
        except BaseException:
            conn.close()
            raise
        return ReadStream(conn, first)

    def _send_stream(self, req: dict[str, Any], data: bytes | Iterable[bytes] | BinaryIO,
                     ready_within: float | None = None) -> dict[str, Any]:
        """Send ``req``, wait for the guest's "ready" (the path checked before we send
        megabytes; at most ``ready_within`` s if given), stream ``data`` in chunks;
        returns the guest's final frame."""
        conn = self._open(req, None)
        try:
            if ready_within is not None and self.io_timeout is not None:
                conn.limit(min(ready_within, self.io_timeout), None)
            conn.recv()
            conn.limit(self.io_timeout, None)
            try:
                for chunk in payload_chunks(data):
                    conn.send({}, chunk)
                conn.send({"eof": True})
            except GuestUnavailableError as exc:
                conn.recv_after_send_failure(exc)
            return conn.final()
        finally:
            conn.close()

    def list(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        return field(self._call({"op": ops.LIST, "path": path, "depth": depth}), "entries", list)

    def stat(self, path: str) -> dict[str, Any]:
        return field(self._call({"op": ops.STAT, "path": path}), "entry", dict)

    def exists(self, path: str) -> bool:
        return field(self._call({"op": ops.EXISTS, "path": path}), "exists", bool)

    def mkdir(self, path: str, parents: bool = True, user: str | None = None) -> None:
        self._call({"op": ops.MKDIR, "path": path, "parents": parents, "user": user})

    def remove(self, path: str, recursive: bool = True, lock_token: str | None = None) -> None:
        req: dict[str, Any] = {"op": ops.REMOVE, "path": path, "recursive": recursive}
        if lock_token is not None:
            req["lock_token"] = lock_token
        self._call(req)

    def rename(self, src: str, dst: str) -> None:
        self._call({"op": ops.RENAME, "src": src, "dst": dst})

    def watch(self, path: str, recursive: bool = False, *, backend: str = "auto",
              timeout: float | None = None) -> GuestWatch:
        """A directory's changes as they happen; returns once the guest watches it (a
        change made after that is seen). ``timeout`` ends the watch (None: never)."""
        conn = self._open({"op": ops.WATCH, "path": path, "recursive": recursive,
                           "backend": backend, "timeout": timeout}, None)
        return GuestWatch(conn, path)
