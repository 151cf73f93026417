"""``AsyncSandbox`` and its parts offer exactly ``Sandbox``'s API, awaited.

``api_differences`` compares two classes member by member: names, kind (method,
classmethod, property) and parameters (names, kinds, defaults). It is not a tautology of
the generator: a method written by hand into an async class only, or with other
parameters than its sync twin, shows up as a difference; ``test_a_drift_is_found``
proves that on synthetic classes.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.sdk.async_sandbox import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncPty,
    AsyncPtyHandle,
    AsyncSecret,
    AsyncVolume,
    AsyncWatchHandle,
)
from agent_sandbox.sdk.commands import CommandHandle, Commands
from agent_sandbox.sdk.files import Files
from agent_sandbox.sdk.pty import Pty, PtyHandle
from agent_sandbox.sdk.secret import Secret
from agent_sandbox.sdk.twin import AsyncTwin, async_twin_of, public_members
from agent_sandbox.sdk.volume import Volume
from agent_sandbox.sdk.watch import WatchHandle

PAIRS = [(Sandbox, AsyncSandbox), (Commands, AsyncCommands), (Files, AsyncFiles),
         (CommandHandle, AsyncCommandHandle), (Pty, AsyncPty), (PtyHandle, AsyncPtyHandle),
         (WatchHandle, AsyncWatchHandle), (Volume, AsyncVolume), (Secret, AsyncSecret)]


def _kind(member: Any) -> str:
    if isinstance(member, classmethod):
        return "classmethod"
    if isinstance(member, property):
        return "property"
    return "method" if inspect.isfunction(member) else "data"


def _parameters(member: Any) -> list[tuple[str, Any, Any]]:
    fn = member.__func__ if isinstance(member, classmethod) else member
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def api_differences(sync_class: type, async_class: type) -> list[str]:
    sync, twin = public_members(sync_class), public_members(async_class)
    out = [f"{name}: only in {async_class.__name__}" for name in twin.keys() - sync.keys()]
    out += [f"{name}: missing from {async_class.__name__}" for name in sync.keys() - twin.keys()]
    for name in sync.keys() & twin.keys():
        kinds = _kind(sync[name]), _kind(twin[name])
        if kinds[0] != kinds[1]:
            out.append(f"{name}: {kinds[0]} in sync, {kinds[1]} in async")
        elif kinds[0] in ("method", "classmethod"):
            if _parameters(sync[name]) != _parameters(twin[name]):
                out.append(f"{name}: parameters differ")
            fn = twin[name].__func__ if kinds[0] == "classmethod" else twin[name]
            if not inspect.iscoroutinefunction(fn):
                out.append(f"{name}: not a coroutine function in {async_class.__name__}")
    if inspect.signature(sync_class) != inspect.signature(async_class):
        out.append("constructor parameters differ")
    if hasattr(sync_class, "__exit__") != hasattr(async_class, "__aexit__"):
        out.append("context manager in one only")
    return sorted(out)


@pytest.mark.parametrize(("sync_class", "async_class"), PAIRS,
                         ids=[a.__name__ for _, a in PAIRS])
def test_async_api_is_the_sync_api(sync_class: type, async_class: type) -> None:
    assert api_differences(sync_class, async_class) == []


def test_the_api_it_compares_is_the_real_one() -> None:
    # The comparison would pass vacuously on empty classes: pin the members it sees.
    members = public_members(AsyncSandbox)
    assert {"create", "connect", "list", "state", "run_code", "kill"} <= members.keys()
    assert "connect" in public_members(AsyncCommands)  # once missing from the async side
    assert _kind(members["state"]) == "property"


def test_a_drift_is_found() -> None:
    class Thing:
        def __init__(self, n: int) -> None:
            self.n = n

        def grow(self, by: int = 1) -> int:
            return self.n + by

    @async_twin_of(Thing)
    class AsyncThing(AsyncTwin):
        pass

    assert api_differences(Thing, AsyncThing) == []

    class AsyncThingPlus(AsyncThing):
        async def shrink(self) -> int:  # added to the async class only
            return 0

    class AsyncThingOther(AsyncThing):
        async def grow(self, by: int = 2) -> int:  # other default than the sync one
            return 0

    class ThingPlus(Thing):
        def double(self) -> int:  # added to the sync class only (not regenerated)
            return 2 * self.n

    assert api_differences(Thing, AsyncThingPlus) == ["shrink: only in AsyncThingPlus"]
    assert api_differences(Thing, AsyncThingOther) == ["grow: parameters differ"]
    assert api_differences(ThingPlus, AsyncThing) == ["double: missing from AsyncThing"]
