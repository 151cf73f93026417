"""``Provider`` lists every method the SDK calls, and every implementation has each one
with the protocol's parameters (an implementation may add parameters with defaults, as
the service's ``owner``)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from agent_sandbox.core.provider import Provider
from agent_sandbox.remote import RemoteProvider
from agent_sandbox.service.service import SandboxService

SDK = Path(__file__).resolve().parents[3] / "agent_sandbox" / "sdk"
PROTOCOL = {name for name in vars(Provider)
            if not name.startswith("_") and inspect.isfunction(vars(Provider)[name])}


def test_every_provider_method_the_sdk_calls_is_in_the_protocol() -> None:
    used: set[str] = set()
    for source in SDK.glob("*.py"):
        # provider.x, self._provider.x, default_provider()).x, code_provider(...).x
        used |= set(re.findall(r"provider(?:\([\w.]*\))?\)?\.(\w+)\(", source.read_text()))
    # The scan finds calls of each shape:
    assert {"create", "list", "run_code", "list_code_contexts", "read_file"} <= used
    assert used - PROTOCOL == set()


@pytest.mark.parametrize("implementation", [SandboxService, RemoteProvider])
def test_implementations_have_the_protocol(implementation: type) -> None:
    for name in sorted(PROTOCOL):
        wanted = inspect.signature(getattr(Provider, name)).parameters
        have = inspect.signature(getattr(implementation, name)).parameters
        if any(p.kind is p.VAR_KEYWORD for p in wanted.values()):  # create(**options)
            continue
        assert list(have)[:len(wanted)] == list(wanted), name
        for extra in list(have.values())[len(wanted):]:
            optional = extra.kind in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD)
            assert optional or extra.default is not extra.empty, (name, extra.name)
        for param in wanted.values():
            assert have[param.name].default == param.default, (name, param.name)
