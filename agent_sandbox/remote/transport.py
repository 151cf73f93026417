"""HTTP plumbing for the remote provider: auth header, error decoding, retries.

Connection errors are retried for a while (the gateway may be restarting); a request is
re-sent only when that is safe: it is idempotent, or the connection failed before any of
it was sent.

``unix:///run/abx/abx.sock`` (an absolute path after ``unix://``) reaches the local abx
daemon over its unix socket instead of TCP; the daemon knows the caller from the socket's
peer credentials, so no key is sent. A socket the caller may not open fails at once with
what to do about it, instead of being retried.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx

from agent_sandbox import __version__
from agent_sandbox.core import cancel
from agent_sandbox.core.errors import (
    CancelledCallError,
    PermissionDeniedError,
    RuntimeUnavailableError,
    SandboxError,
)
from agent_sandbox.remote.errors import decode_error

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
# Before a byte is sent: safe to retry whatever the method.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_RETRY_SECONDS = 30.0  # the default of ABX_SANDBOX_RETRY_SECONDS (select.py passes it)
_CONNECT_TIMEOUT = 10.0  # seconds for one connection attempt, at most
_MIN_CONNECT_TIMEOUT = 3.0
UNIX_SCHEME = "unix://"
_LIMITS = httpx.Limits(max_connections=200, max_keepalive_connections=50)


def unix_socket_path(base_url: str) -> str | None:
    """The socket path of a ``unix:///path`` base URL, or None for an http(s) URL."""
    if not base_url.startswith(UNIX_SCHEME):
        return None
    path = base_url[len(UNIX_SCHEME):]
    if not path.startswith("/"):
        raise SandboxError(f"a unix socket URL needs an absolute path: unix:///run/abx/abx.sock, "
                           f"not {base_url!r}")
    return path.rstrip("/") or "/"


def _errno_of(exc: BaseException) -> int | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


class Transport:
    def __init__(self, base_url: str, api_key: str | None, *,
                 retry_seconds: float = _RETRY_SECONDS,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"User-Agent": f"agent-sandbox-remote/{__version__}"}
        self.socket_path = unix_socket_path(base_url)
        if self.socket_path is not None:
            if transport is None:
                transport = httpx.HTTPTransport(uds=self.socket_path, limits=_LIMITS)
            base_url = "http://abx-daemon"
            self.where = f"the abx daemon at {self.socket_path}"
        else:
            self.where = f"the sandbox gateway at {base_url.rstrip('/')}"
            if api_key:
                headers["Authorization"] = f"Bearer {api_key}"
        self.retry_seconds = retry_seconds
        # No read timeout: a command may legitimately run for its whole timeout; a dead
        # gateway shows up as a connection error, not silence. A caller that retries
        # briefly (the CLI) also waits briefly for a connection.
        connect = min(_CONNECT_TIMEOUT, max(_MIN_CONNECT_TIMEOUT, retry_seconds))
        self.client = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, transport=transport,
            timeout=httpx.Timeout(connect=connect, read=None, write=60.0, pool=60.0),
            limits=_LIMITS)

    def close(self) -> None:
        self.client.close()

    def _send(self, method: str, url: str, *, stream: bool, replayable: bool,
              **kw: Any) -> httpx.Response:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.05
        while True:
            try:
                request = self.client.build_request(method, url, **kw)
                return self.client.send(request, stream=stream)
            except httpx.TransportError as exc:
                if self.socket_path is not None and _errno_of(exc) == errno.EACCES:
                    raise self._denied() from exc
                safe = isinstance(exc, _NOT_SENT) or method in _IDEMPOTENT
                if not (safe and replayable) or time.monotonic() + delay > deadline:
                    raise self._unreachable(exc, safe) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _unreachable(self, exc: httpx.TransportError, retryable: bool) -> SandboxError:
        code = _errno_of(exc)
        if isinstance(exc, httpx.ConnectTimeout):
            why = "no answer to the connection (wrong address, or a firewall drops it?)"
        elif code in (errno.ECONNREFUSED, errno.ENOENT):
            why = "nothing is listening there (is it running?)"
        elif isinstance(exc, httpx.ConnectError) and "name" in str(exc).lower():
            why = f"the host name does not resolve ({exc})"
        else:
            why = str(exc) or type(exc).__name__
        fix = ("start it (`abx serve`, or `sudo abx daemon install`)" if self.socket_path
               else "check the URL (`abx config get base_url`, ABX_SANDBOX_BASE_URL) and "
                    "that the gateway runs (`abx serve`)")
        tried = f" (retried for {self.retry_seconds:g}s)" if retryable and \
            self.retry_seconds >= 1 else ""
        return RuntimeUnavailableError(f"cannot reach {self.where}: {why}{tried}; {fix}",
                                       details={"retryable": retryable})

    def _denied(self) -> SandboxError:
        return PermissionDeniedError(
            f"permission denied connecting to {self.where}: only root and members of its "
            "group (abx) may use it. Ask an administrator to run `sudo usermod -aG abx "
            "$USER`, then log in again; or run sandboxes without the daemon (`abx doctor` "
            "shows what works here)",
            details={"socket": self.socket_path, "retryable": False})

    def request(self, method: str, url: str, *, replayable: bool = True,
                **kw: Any) -> Any:
        """A JSON call: the decoded body (None for 204), or the error it stands for."""
        response = self._send(method, url, stream=False, replayable=replayable, **kw)
        if response.status_code >= 400:
            raise decode_error(response.status_code, response.content,
                               response.headers.get("retry-after"))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def open_stream(self, method: str, url: str, *, replayable: bool = True,
                    **kw: Any) -> httpx.Response:
        """A streamed response, already checked for an error status."""
        response = self._send(method, url, stream=True, replayable=replayable, **kw)
        if response.status_code >= 400:
            try:
                body = response.read()
            finally:
                response.close()
            raise decode_error(response.status_code, body, response.headers.get("retry-after"))
        return response

    def ndjson(self, method: str, url: str, on_event: Callable[[dict[str, Any]], None],
               **kw: Any) -> None:
        """Stream NDJSON events to ``on_event`` until the response ends."""
        response = self.open_stream(method, url, replayable=False, **kw)
        # A cancelled call (Ctrl-C in `abx sandbox exec`, an MCP cancel) cuts the stream:
        # the gateway sees the client go and stops what the request started.
        call = cancel.current()
        key = None if call is None else call.register(lambda: _cut(response))
        try:
            for line in response.iter_lines():
                if line.strip():
                    on_event(json.loads(line))
        except httpx.TransportError as exc:
            if call is not None and call.cancelled:
                raise CancelledCallError(f"the call to {self.where} was cancelled; what it "
                                         "started was stopped") from None
            raise SandboxError(f"the connection to {self.where} broke during the call: "
                               f"{exc or type(exc).__name__}") from exc
        finally:
            if call is not None and key is not None:
                call.unregister(key)
            response.close()


def _cut(response: httpx.Response) -> None:
    """Shut the response's connection down from another thread (closing alone would not
    wake a thread blocked reading it)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def iter_bytes(response: httpx.Response, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """A response body as chunks; the connection goes back to the pool at the end. A
    body cut off midway (the sandbox or the gateway failed after the status went out) is
    a SandboxError, not the HTTP library's."""
    try:
        yield from response.iter_bytes(chunk_size)
    except httpx.HTTPError as exc:
        raise SandboxError(f"the download from {response.request.url.path} broke off "
                           f"before its end ({type(exc).__name__}: {exc}); the gateway's "
                           "log says why") from exc
    finally:
        response.close()
