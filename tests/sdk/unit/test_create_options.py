"""``core.spec.CreateSpec`` is the one definition of ``create()``'s options: the SDK's
signature, the gateway's request body and the service's check all come from it."""

from __future__ import annotations

import inspect

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.spec import OPTION_NAMES, CreateSpec, sdk_defaults
from agent_sandbox.remote import RemoteProvider
from agent_sandbox.sdk.sandbox import create_arguments
from agent_sandbox.service.service import SandboxService
from agent_sandbox.surfaces.rest.routes.sandboxes import create_sandbox

OPTIONS = sdk_defaults()


def test_sdk_create_signature_is_the_options_then_provider() -> None:
    assert tuple(OPTIONS) == OPTION_NAMES
    for create in (Sandbox.create, AsyncSandbox.create):
        params = inspect.signature(create).parameters
        assert list(params) == [*OPTIONS, "provider"]
        assert {n: p.default for n, p in params.items() if n != "provider"} == OPTIONS
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params.values())


def test_the_gateway_body_and_the_service_take_the_spec() -> None:
    assert inspect.signature(create_sandbox).parameters["body"].annotation == "CreateSpec"
    params = inspect.signature(SandboxService.create).parameters
    assert [p.kind for p in params.values()][-1] is inspect.Parameter.VAR_KEYWORD


def test_create_arguments_as_a_plain_signature_binds_them() -> None:
    options, provider = create_arguments(Sandbox, "code", 60, memory_mb=256)
    assert provider is None
    assert options == {"template": "code", "timeout": 60, "memory_mb": 256}
    spec = CreateSpec.of(options)
    assert (spec.template, spec.timeout, spec.memory_mb, spec.cpu) == ("code", 60, 256, None)


def test_a_bad_create_argument_is_named_before_any_provider_is_used() -> None:
    with pytest.raises(TypeError, match="memory"):
        Sandbox.create(memory=256)
    with pytest.raises(TypeError, match="multiple values for argument 'template'"):
        Sandbox.create("a", template="b")
    with pytest.raises(TypeError, match="memory"):
        RemoteProvider("http://127.0.0.1:9").create(memory=256)  # refused before sending
    with pytest.raises(TypeError, match="memory"):
        CreateSpec.of({"memory": 256})


@pytest.mark.parametrize(("options", "says"), [
    ({"memory_mb": 16}, "memory_mb must be at least 32"),
    ({"memory_mb": 1.5}, "memory_mb must be a whole number"),
    ({"timeout": 0}, "timeout must be greater than 0"),
    ({"timeout": True}, "timeout must be a number"),
    ({"persistent": 1}, "persistent must be true or false"),
    ({"envs": {"1A": "x"}}, "invalid environment variable name"),
    ({"network": "nonsense!"}, "network"),
    ({"template": "Bad Name"}, "invalid template name"),
    ({"volume": 3}, "volume must be a volume id"),
])
def test_a_bad_value_gets_the_one_message_every_surface_shows(options: dict[str, object],
                                                               says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        CreateSpec.of(options)


def test_every_surface_takes_every_option(tmp_path: object) -> None:
    """An option added to the spec reaches every surface by itself (lifetime, on_timeout
    and keep_volume came this way): the SDK's signature, the gateway's body, the MCP tool
    (all but what is for programs and operators), the CLI's options."""
    from agent_sandbox.surfaces.cli.sandbox_cmd import PAIRS, create
    from agent_sandbox.surfaces.mcp.tool_args import NOT_FOR_MODELS, CreateSandboxArgs

    body = CreateSpec.model_json_schema()["properties"]
    tool = CreateSandboxArgs.model_fields
    cli = inspect.signature(create).parameters
    for name in OPTION_NAMES:
        assert name in OPTIONS and name in body and name in cli, name
        assert (name in tool) != (name in NOT_FOR_MODELS), name
    assert set(PAIRS) <= set(OPTION_NAMES)
    assert {"lifetime", "on_timeout", "keep_volume"} <= set(tool)
