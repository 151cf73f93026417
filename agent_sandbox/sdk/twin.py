"""Async twins of the sync SDK classes, generated from them so the two cannot drift.

``@async_twin_of(Commands)`` fills a class with one coroutine per public method of
``Commands``: it runs the sync method in a worker thread (calls run concurrently; the
event loop never blocks) and hands back async twins of what it returns (a
``CommandHandle`` becomes an ``AsyncCommandHandle``, a chunk iterator an async iterator).
Signatures and docstrings are the sync ones. Callbacks (``on_stdout``, ``on_stderr``,
``on_result``, ``on_data``, ``on_event``) may be plain functions or coroutine functions.

A property marked ``@asks_provider`` (its value is fetched, e.g. ``Sandbox.state``) is
awaited on the twin: ``await sb.state``. Other properties are plain on both.

The worker threads are this module's own pool, not the event loop's default executor
(``asyncio.to_thread``: CPUs + 4 threads, so 6 calls at once on a 2-core host, whatever
else the application wants). ``set_max_threads(n)`` sizes it: that many blocking calls run
at once, the rest queue (threads start only as needed). The MCP servers size it from
``ABX_MCP_MAX_CONCURRENCY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from agent_sandbox.core.cancel import CallCancel

CALLBACKS = frozenset({"on_stdout", "on_stderr", "on_result", "on_data", "on_event"})
# Sync class -> its async twin, to convert what sync methods return.
_TWINS: dict[type, type[AsyncTwin]] = {}

T = TypeVar("T", bound="AsyncTwin")
F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

DEFAULT_MAX_THREADS = 64
_pool_guard = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_max_threads = DEFAULT_MAX_THREADS


def set_max_threads(n: int) -> None:
    """Let ``n`` blocking SDK calls run at once (default 64). Calls already running finish in
    the pool they started in; new ones use a pool of the new size."""
    global _pool, _max_threads
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max threads must be a positive integer, got {n!r}")
    with _pool_guard:
        # The old pool is only dropped (no shutdown, so a call racing this one still gets
        # in): once unreferenced, its threads finish their work and exit.
        _pool, _max_threads = None, n


def max_threads() -> int:
    """How many blocking SDK calls may run at once."""
    return _max_threads


def _executor() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_guard:
            if _pool is None:
                _pool = ThreadPoolExecutor(_max_threads, thread_name_prefix="abx-sdk")
            pool = _pool
    return pool


async def in_thread(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` in the SDK's pool (``asyncio.to_thread`` without its cap).
    Cancelling the caller stops what ``fn`` started (the thread itself cannot be stopped:
    it ends once the guest connections it opened are shut down)."""
    loop = asyncio.get_running_loop()
    cancel = CallCancel()
    call = functools.partial(contextvars.copy_context().run, cancel.run, fn, *args, **kwargs)
    try:
        return await loop.run_in_executor(_executor(), call)
    except asyncio.CancelledError:
        cancel.cancel()
        raise


def asks_provider(getter: F) -> F:
    """Mark a property getter that asks the provider (blocking I/O): awaited on the twin."""
    getter.asks_provider = True  # type: ignore[attr-defined]
    return getter


class AsyncTwin:
    """Base of a generated async class; ``_sync`` is the sync object it drives.

    Its constructor takes the sync class's arguments (``AsyncCommandHandle(provider,
    sandbox_id, pid)`` as ``CommandHandle(...)``); public attributes that are sync SDK
    objects (``sandbox.commands``) become their twins, other public data is copied.
    """

    _sync_class: ClassVar[type]
    _sync: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init = inspect.signature(self._sync_class)
        args, kwargs = _bridge_arguments(init, args, kwargs)
        self._adopt(self._sync_class(*args, **kwargs))

    @classmethod
    def _wrap(cls: type[T], sync: Any) -> T:
        twin = cls.__new__(cls)
        twin._adopt(sync)
        return twin

    def _adopt(self, sync: Any) -> None:
        self._sync = sync
        for name, value in vars(sync).items():
            if not name.startswith("_"):
                setattr(self, name, to_async(value))

    def __repr__(self) -> str:
        return f"Async{self._sync!r}"


def to_async(value: Any) -> Any:
    """``value`` as the async API hands it out."""
    twin = _TWINS.get(type(value))
    if twin is not None:
        return twin._wrap(value)
    if isinstance(value, Iterator):
        chunks = _async_chunks(value)
        version = getattr(value, "version", None)
        return chunks if version is None else AsyncFileChunks(chunks, version)
    return value


class AsyncFileChunks(AsyncIterator[Any]):
    """A file's chunks for asyncio, with the ``version`` it was read at."""

    def __init__(self, chunks: AsyncIterator[Any], version: str) -> None:
        self._chunks = chunks
        self.version = version

    def __anext__(self) -> Any:
        return self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]


async def _async_chunks(chunks: Iterator[Any]) -> AsyncIterator[Any]:
    end = object()
    try:
        while (item := await in_thread(next, chunks, end)) is not end:
            yield item
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            # ValueError: a cancelled next() still runs in its thread; it closes at its end.
            with contextlib.suppress(ValueError):
                await in_thread(close)


def _bridge(callback: Callable[[Any], Any] | None,
            loop: asyncio.AbstractEventLoop) -> Callable[[Any], None] | None:
    """``callback`` callable from a worker thread; a coroutine function runs on ``loop``."""
    if callback is None:
        return None

    def call(value: Any) -> None:
        out = callback(value)
        if inspect.isawaitable(out):
            asyncio.run_coroutine_threadsafe(_await(out), loop).result()

    return call


async def _await(awaitable: Any) -> None:
    await awaitable


def _first_callback(signature: inspect.Signature) -> int | None:
    """Where the first callback parameter is among the positional ones (None: it has no
    callback parameter), so calls that pass no callback skip ``bind`` (the sync method
    still raises the TypeError of a bad call)."""
    names = [p.name for p in signature.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    hits = [i for i, name in enumerate(names) if name in CALLBACKS]
    return hits[0] if hits else None


def _bridge_arguments(signature: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any], first: int | None = 0
                      ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with its callbacks made callable from a worker thread (a bad
    call raises the TypeError the sync method would). ``first``: see _first_callback."""
    if first is None or (len(args) <= first and all(kwargs.get(n) is None for n in CALLBACKS)):
        return args, kwargs
    bound = signature.bind(*args, **kwargs)
    names = CALLBACKS & bound.arguments.keys()
    if names:
        loop = asyncio.get_running_loop()
        for name in names:
            bound.arguments[name] = _bridge(bound.arguments[name], loop)
    return bound.args, bound.kwargs


def _without_first(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _async_annotation(annotation: Any) -> Any:
    """A sync return annotation in async terms (``CommandHandle`` -> ``AsyncCommandHandle``)."""
    if not isinstance(annotation, str):
        return annotation
    names = {sync.__name__: twin.__name__ for sync, twin in _TWINS.items()}
    names["Iterator"] = "AsyncIterator"
    return re.sub(r"\b\w+\b", lambda m: names.get(m.group(), m.group()), annotation)


def _named(fn: Callable[..., Any], like: Callable[..., Any], owner: type) -> None:
    fn.__name__ = like.__name__
    fn.__qualname__ = f"{owner.__name__}.{like.__name__}"
    fn.__doc__ = like.__doc__
    signature = inspect.signature(like)
    fn.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=_async_annotation(signature.return_annotation))


def _method(name: str, function: Callable[..., Any], owner: type) -> Callable[..., Any]:
    signature = _without_first(inspect.signature(function))
    first = _first_callback(signature)

    async def method(self: AsyncTwin, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _bridge_arguments(signature, args, kwargs, first)
        return to_async(await in_thread(getattr(self._sync, name), *args, **kwargs))

    _named(method, function, owner)
    return method


def _classmethod(name: str, sync_class: type, owner: type) -> classmethod[Any, Any, Any]:
    bound_sync = getattr(sync_class, name)
    signature = inspect.signature(bound_sync)
    first = _first_callback(signature)

    async def method(cls: type[AsyncTwin], *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _bridge_arguments(signature, args, kwargs, first)
        out = await in_thread(bound_sync, *args, **kwargs)
        # A subclass of the twin gets instances of itself, as ``cls(...)`` gives in sync.
        return cls._wrap(out) if type(out) is sync_class else to_async(out)

    _named(method, bound_sync.__func__, owner)
    return classmethod(method)


def _property(name: str, prop: property) -> property:
    if getattr(prop.fget, "asks_provider", False):
        def fetch(self: AsyncTwin) -> Any:
            return in_thread(getattr, self._sync, name)  # awaited by the caller

        return property(fetch, doc=prop.__doc__)
    return property(lambda self: getattr(self._sync, name), doc=prop.__doc__)


def _context_manager(cls: type) -> None:
    async def aenter(self: AsyncTwin) -> AsyncTwin:
        return self

    async def aexit(self: AsyncTwin, *exc: Any) -> None:
        await in_thread(self._sync.__exit__, *exc)

    cls.__aenter__ = aenter  # type: ignore[attr-defined]
    cls.__aexit__ = aexit  # type: ignore[attr-defined]


def public_members(cls: type) -> dict[str, Any]:
    """The public members ``cls`` defines or inherits (not from ``object``), raw."""
    members: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[:-1]):
        members.update((k, v) for k, v in vars(klass).items() if not k.startswith("_"))
    return members


def async_twin_of(sync_class: type) -> Callable[[type[T]], type[T]]:
    """Class decorator: make the class the async twin of ``sync_class``."""

    def build(cls: type[T]) -> type[T]:
        cls._sync_class = sync_class
        _TWINS[sync_class] = cls
        for name, member in public_members(sync_class).items():
            if isinstance(member, classmethod):
                setattr(cls, name, _classmethod(name, sync_class, cls))
            elif isinstance(member, property):
                setattr(cls, name, _property(name, member))
            elif inspect.isfunction(member):
                setattr(cls, name, _method(name, member, cls))
        if hasattr(sync_class, "__exit__"):
            _context_manager(cls)
        cls.__doc__ = cls.__doc__ or sync_class.__doc__
        if "__init__" not in vars(cls):
            def __init__(self: AsyncTwin, *args: Any, **kwargs: Any) -> None:
                AsyncTwin.__init__(self, *args, **kwargs)

            __init__.__signature__ = inspect.signature(sync_class.__init__)  # type: ignore[attr-defined]
            cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return build
