"""Terminals through a gateway or the daemon: one WebSocket per attachment
(``/v1/sandboxes/{id}/pty``; the protocol is in docs/terminals.md).

The client sends the terminal to open (or the pid to attach to) as its first message and
gets ``{"pid": N}``; then binary messages are output one way and keystrokes the other,
``{"resize": [cols, rows]}`` resizes, and the gateway ends with ``{"exit_code": N}`` or
``{"error": {...}}``. Messages are bounded (``MAX_MESSAGE``); nothing is kept.
"""

from __future__ import annotations

import inspect
import json
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from agent_sandbox.core.errors import RuntimeUnavailableError, SandboxError, error_from_code
from agent_sandbox.core.pty import INPUT_CHUNK, DataCallback, PtySession, check_size, input_bytes
from agent_sandbox.remote.errors import decode_error
from agent_sandbox.remote.transport import Transport

MAX_MESSAGE = 4 << 20  # the largest message taken from the gateway
START_TIMEOUT = 60.0  # connect, handshake and the gateway's first answer


def _websockets() -> Any:
    try:
        from websockets.sync import client
    except ImportError:
        raise RuntimeUnavailableError(
            "terminals through a gateway need the 'websockets' package: "
            "pip install 'websockets>=14'") from None
    return client


def _socket(http: Transport) -> tuple[socket.socket, str, bool]:
    """A connected socket to the gateway, the WebSocket URI base and whether it is TLS."""
    if http.socket_path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(START_TIMEOUT)
        try:
            sock.connect(http.socket_path)
        except OSError as exc:
            sock.close()
            if isinstance(exc, PermissionError):
                raise http._denied() from exc
            raise SandboxError(f"cannot reach {http.where}: {exc}") from exc
        return sock, "ws://abx-daemon", False
    url = urlsplit(str(http.client.base_url))
    secure = url.scheme == "https"
    port = url.port or (443 if secure else 80)
    try:
        sock = socket.create_connection((url.hostname or "localhost", port), START_TIMEOUT)
    except OSError as exc:
        raise SandboxError(f"cannot reach {http.where}: {exc}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    host = url.netloc.rpartition("@")[2]
    return sock, f"{'wss' if secure else 'ws'}://{host}{url.path.rstrip('/')}", secure


def _event(message: str | bytes) -> dict[str, Any]:
    try:
        event = json.loads(message)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise SandboxError(f"the gateway sent an invalid terminal message: {str(message)[:80]!r}")
    return event


def _raise_error(event: dict[str, Any]) -> None:
    err = event.get("error")
    if err is not None:
        if not isinstance(err, dict):
            raise SandboxError(f"the gateway sent an invalid error: {str(err)[:80]!r}")
        details = err.get("details")
        raise error_from_code(str(err.get("code", "internal"))[:40],
                              str(err.get("message", "gateway error"))[:4000],
                              details if isinstance(details, dict) else None)


def open_remote_pty(http: Transport, path: str, first: dict[str, Any],
                    on_data: DataCallback | None,
                    kill: Callable[[int, int], bool]) -> RemotePty:
    """Open the WebSocket at ``path``, ask for ``first`` and return the attachment."""
    from websockets.exceptions import WebSocketException

    ws, sock = connect_websocket(http, path, "a terminal")
    try:
        ws.send(json.dumps(first))
        event = _event(ws.recv(timeout=START_TIMEOUT))
        _raise_error(event)
        pid = event.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise SandboxError(f"the gateway sent an invalid terminal pid: {pid!r}")
    except (WebSocketException, OSError) as exc:
        ws.close()
        raise SandboxError(f"the terminal connection to {http.where} broke: {exc!r}") from exc
    except BaseException:
        ws.close()
        raise
    try:
        sock.settimeout(None)  # an idle terminal is no dead gateway (pings tell those apart)
    except OSError:
        pass  # closed already: the terminal ended at once, and the attachment says so
    return RemotePty(ws, pid, on_data, kill, http.where)


def connect_websocket(http: Transport, path: str, what: str) -> tuple[Any, socket.socket]:
    """A WebSocket to the gateway's ``path`` with the provider's credentials; a refusal
    raises the gateway's error (401, 404...) as the SDK's own."""
    client = _websockets()
    from websockets.exceptions import InvalidStatus, WebSocketException

    sock, base, secure = _socket(http)
    headers = {k: v for k, v in http.client.headers.items()
               if k.lower() in ("authorization", "user-agent")}
    kw: dict[str, Any] = {"ssl": ssl.create_default_context()} if secure else {}
    if "legacy" in inspect.signature(client.connect).parameters:
        kw["legacy"] = True  # websockets >= 16: a plain connection, not a reconnecting one
    try:
        ws = client.connect(base + path, sock=sock, additional_headers=headers,
                            compression=None, max_size=MAX_MESSAGE, open_timeout=START_TIMEOUT,
                            user_agent_header=None, **kw)
    except InvalidStatus as exc:
        sock.close()
        response = exc.response
        raise decode_error(response.status_code, bytes(response.body or b""),
                           response.headers.get("Retry-After")) from None
    except (WebSocketException, OSError) as exc:
        sock.close()
        raise SandboxError(f"cannot open {what} through {http.where}: {exc!r}") from exc
    return ws, sock


class RemotePty(PtySession):
    def __init__(self, ws: Any, pid: int, on_data: DataCallback | None,
                 kill: Callable[[int, int], bool], where: str) -> None:
        super().__init__(pid, on_data)
        self._ws = ws
        self._kill = kill
        self._where = where
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"abx-pty-{pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        from websockets.exceptions import WebSocketException

        code: int | None = None
        error: SandboxError | None = None
        try:
            while True:
                message = self._ws.recv()
                if isinstance(message, bytes):
                    if not self.deliver(message):
                        break
                    continue
                event = _event(message)
                _raise_error(event)
                if "exit_code" in event:
                    code = event["exit_code"]
                    if isinstance(code, bool) or not isinstance(code, int):
                        raise SandboxError(f"the gateway sent an invalid exit code: {code!r}")
                    break
        except SandboxError as exc:
            error = exc
        except (WebSocketException, OSError) as exc:
            error = SandboxError(f"lost the terminal connection to {self._where}: {exc!r} "
                                 f"(terminal {self.pid} keeps running; pty.connect attaches)")
        finally:
            self._ws.close()
            if self.closed and code is None:
                error = self.detached_error()
            self._end(code, error)

    def _send(self, message: str | bytes) -> None:
        from websockets.exceptions import WebSocketException

        self._check_open()
        try:
            with self._send_lock:
                self._ws.send(message)
        except (WebSocketException, OSError) as exc:
            self._check_open()  # ended meanwhile: say so
            raise SandboxError(f"lost the terminal connection to {self._where}: "
                               f"{exc!r}") from exc

    def send_input(self, data: bytes | str) -> None:
        raw = input_bytes(data)
        for start in range(0, len(raw), INPUT_CHUNK):
            self._send(raw[start:start + INPUT_CHUNK])

    def resize(self, cols: int, rows: int) -> None:
        cols, rows = check_size(cols, rows)
        self._send(json.dumps({"resize": [cols, rows]}))

    def kill(self, sig: int = 9) -> bool:
        if self._exit_code is not None:
            return False
        return self._kill(self.pid, int(sig))

    def close(self) -> None:
        """Detach: the program keeps running."""
        self.closed = True
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(5.0)
