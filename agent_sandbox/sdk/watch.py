"""``WatchHandle``: a directory being watched (``sandbox.files.watch_dir``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError, SandboxError
from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.core.watch import EventQueue, WatchStream

EventCallback = Callable[[FilesystemEvent], None]
MAX_QUEUED_EVENTS = 10000
MAX_QUEUED_BYTES = 16 << 20


class WatchHandle:
    """Changes in a sandbox directory, as they happen, until ``stop()``.

    Iterate it (``for event in handle``: blocks for the next one, ends when the watch
    does), poll it (``get_new_events()``, ``next_event(timeout)``), or give
    ``watch_dir`` an ``on_event`` callback (called from a thread of the handle's).
    Events wait in a bounded queue: past ``MAX_QUEUED_EVENTS`` unread ones, new ones are
    dropped and one ``overflow`` event says how many. As a context manager it stops on exit.
    """

    def __init__(self, stream: WatchStream, on_event: EventCallback | None = None) -> None:
        self._stream = stream
        self._on_event = on_event
        self._queue = EventQueue(MAX_QUEUED_EVENTS, MAX_QUEUED_BYTES)
        self._error: BaseException | None = None
        self._stopped = False
        self._reader = threading.Thread(target=self._read, name="abx-watch", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                if self._on_event is not None:
                    self._on_event(event)
                else:
                    self._queue.put(event)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader of the handle
            self._error = exc
            self._stream.close()
        finally:
            self._queue.finish()

    @property
    def backend(self) -> str:
        """How the sandbox watches: ``inotify``, or ``poll`` where inotify is missing."""
        return self._stream.backend

    @property
    def ended(self) -> str | None:
        """Why the watch ended (``stopped``, ``timeout``, the directory was deleted...);
        None while it runs."""
        if self._reader.is_alive():
            return None
        return "failed" if self._error is not None else (self._stream.ended or "ended")

    @property
    def error(self) -> BaseException | None:
        """What broke the watch (the sandbox went away, or ``on_event`` raised), if it broke."""
        return self._error

    def next_event(self, timeout: float | None = None) -> FilesystemEvent | None:
        """The next event, waiting up to ``timeout`` seconds (None: until one comes);
        None if none came, or the watch ended (its error, if it broke, is raised)."""
        self._no_callback()
        event = self._queue.get(timeout)
        if event is None and self._queue.finished:
            self._raise()
        return event

    def get_new_events(self) -> list[FilesystemEvent]:
        """The events since the last call, without waiting."""
        self._no_callback()
        events = self._queue.drain()
        if not events and self._queue.finished:
            self._raise()
        return events

    def stop(self) -> None:
        """Stop watching; events already received can still be read."""
        self._stopped = True
        self._stream.close()
        if threading.current_thread() is not self._reader:  # on_event may call stop()
            self._reader.join(10)

    def __iter__(self) -> Iterator[FilesystemEvent]:
        self._no_callback()
        while True:
            event = self._queue.get()
            if event is None:
                self._raise()
                return
            yield event

    def _done(self) -> bool:
        """Ended, and every event read."""
        return self._queue.finished

    def _no_callback(self) -> None:
        if self._on_event is not None:
            raise InvalidArgumentError("this watch delivers its events to on_event; read "
                                       "them there (or watch without on_event to read them "
                                       "from the handle)")

    def _raise(self) -> None:
        if self._error is not None and not self._stopped:
            if isinstance(self._error, SandboxError):
                raise self._error
            raise SandboxError(f"the watch failed: {self._error!r}") from self._error

    def __enter__(self) -> WatchHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"WatchHandle(backend={self.backend!r}, ended={self.ended!r})"
