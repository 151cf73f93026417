"""``CreateOptions`` is the one list of ``create()``'s options: the SDK's signature is
built from it, and the engine's keywords and the gateway's schema must agree with it."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.models import CreateOptions
from agent_sandbox.providers.kubernetes.provider import KubernetesProvider
from agent_sandbox.providers.remote import RemoteProvider
from agent_sandbox.runtime.engine import Engine
from agent_sandbox.sdk.sandbox import create_arguments
from agent_sandbox.server.schemas import CreateSandbox

OPTIONS = {f.name: f.default for f in fields(CreateOptions)}


def test_sdk_create_signature_is_the_options_then_provider() -> None:
    for create in (Sandbox.create, AsyncSandbox.create):
        params = inspect.signature(create).parameters
        assert list(params) == [*OPTIONS, "provider"]
        assert {n: p.default for n, p in params.items() if n != "provider"} == OPTIONS
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params.values())


def test_engines_and_gateway_schema_take_the_same_options() -> None:
    for engine_class in (Engine, KubernetesProvider):
        engine = inspect.signature(engine_class.create).parameters
        assert {n: p.default for n, p in engine.items() if n not in ("self", "owner")} == OPTIONS
    schema = {n: f.default for n, f in CreateSandbox.model_fields.items()}
    assert schema == OPTIONS


def test_create_arguments_as_a_plain_signature_binds_them() -> None:
    options, provider = create_arguments(Sandbox, "code", 60, memory_mb=256)
    assert provider is None
    assert options == CreateOptions(template="code", timeout=60, memory_mb=256)
    assert options.as_kwargs() == {**OPTIONS, "template": "code", "timeout": 60,
                                   "memory_mb": 256}


def test_a_bad_create_argument_is_named_before_any_provider_is_used() -> None:
    with pytest.raises(TypeError, match="memory"):
        Sandbox.create(memory=256)
    with pytest.raises(TypeError, match="multiple values for argument 'template'"):
        Sandbox.create("a", template="b")
    with pytest.raises(TypeError, match="memory"):
        RemoteProvider("http://127.0.0.1:9").create(memory=256)  # refused before sending
