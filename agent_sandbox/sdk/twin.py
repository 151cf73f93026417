"""Async twins of the sync SDK classes, generated from them so the two cannot drift.

``@async_twin_of(Commands)`` fills a class with one coroutine per public method of
``Commands``: it runs the sync method in a worker thread (calls run concurrently; the
event loop never blocks) and hands back async twins of what it returns (a
``CommandHandle`` becomes an ``AsyncCommandHandle``, a chunk iterator an async iterator).
Signatures and docstrings are the sync ones. Callbacks (``on_stdout``, ``on_stderr``,
``on_result``, ``on_event``) may be plain functions or coroutine functions.

A property marked ``@asks_provider`` (its value is fetched, e.g. ``Sandbox.state``) is
awaited on the twin: ``await sb.state``. Other properties are plain on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar, TypeVar

from agent_sandbox.cancel import CallCancel

CALLBACKS = frozenset({"on_stdout", "on_stderr", "on_result", "on_event"})
# Sync class -> its async twin, to convert what sync methods return.
_TWINS: dict[type, type[AsyncTwin]] = {}

T = TypeVar("T", bound="AsyncTwin")
F = TypeVar("F", bound=Callable[..., Any])


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
        return _async_chunks(value)
    return value


async def _async_chunks(chunks: Iterator[Any]) -> AsyncIterator[Any]:
    end = object()
    try:
        while (item := await asyncio.to_thread(next, chunks, end)) is not end:
            yield item
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            # ValueError: a cancelled next() still runs in its thread; it closes at its end.
            with contextlib.suppress(ValueError):
                await asyncio.to_thread(close)


async def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` in a worker thread; cancelling the caller stops what ``fn`` started (the
    thread itself cannot be stopped: it ends when its guest connections are shut down)."""
    call = CallCancel()
    try:
        return await asyncio.to_thread(call.run, fn, *args, **kwargs)
    except asyncio.CancelledError:
        call.cancel()
        raise


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


def _bridge_arguments(signature: inspect.Signature, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with its callbacks made callable from a worker thread (a bad
    call raises the TypeError the sync method would)."""
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

    async def method(self: AsyncTwin, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _bridge_arguments(signature, args, kwargs)
        return to_async(await in_thread(getattr(self._sync, name), *args, **kwargs))

    _named(method, function, owner)
    return method


def _classmethod(name: str, sync_class: type, owner: type) -> classmethod[Any, Any, Any]:
    bound_sync = getattr(sync_class, name)
    signature = inspect.signature(bound_sync)

    async def method(cls: type[AsyncTwin], *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _bridge_arguments(signature, args, kwargs)
        out = await in_thread(bound_sync, *args, **kwargs)
        # A subclass of the twin gets instances of itself, as ``cls(...)`` gives in sync.
        return cls._wrap(out) if type(out) is sync_class else to_async(out)

    _named(method, bound_sync.__func__, owner)
    return classmethod(method)


def _property(name: str, prop: property) -> property:
    if getattr(prop.fget, "asks_provider", False):
        def fetch(self: AsyncTwin) -> Any:
            return asyncio.to_thread(getattr, self._sync, name)  # awaited by the caller

        return property(fetch, doc=prop.__doc__)
    return property(lambda self: getattr(self._sync, name), doc=prop.__doc__)


def _context_manager(cls: type) -> None:
    async def aenter(self: AsyncTwin) -> AsyncTwin:
        return self

    async def aexit(self: AsyncTwin, *exc: Any) -> None:
        await asyncio.to_thread(self._sync.__exit__, *exc)

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
