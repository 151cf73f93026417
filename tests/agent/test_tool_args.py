"""Each tool's argument model: the schema tools/list shows and the check of a call are one.

In-process, no sandbox: nothing here needs root, runc or an engine. The values and the
expected answers come from each tool's listed schema, so a new argument is covered as soon
as it is declared.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jsonschema
import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.surfaces.mcp.args import parse_args
from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS

SPECS = {spec.name: spec for spec in ALL_TOOLS}
# Each tool's smallest valid call.
MINIMAL: dict[str, dict[str, Any]] = {
    "create_sandbox": {}, "list_sandboxes": {}, "list_templates": {}, "list_files": {},
    "run_code": {"code": "1"}, "run_command": {"command": "true"},
    "process_output": {"pid": 7}, "kill_process": {"pid": 7},
    "read_file": {"path": "/x"}, "write_file": {"path": "/x", "content": ""},
    "set_network": {"network": "registries"},
    "pause_sandbox": {"sandbox_id": "sbx-0123456789"},
    "resume_sandbox": {"sandbox_id": "sbx-0123456789"},
    "reset_rootfs": {"sandbox_id": "sbx-0123456789"},
    "expose_port": {"port": 8000},
    "kill_sandbox": {"sandbox_id": "sbx-0123456789"},
    "lock_file": {"path": "/x"}, "unlock_file": {"path": "/x", "token": "ab12"},
    "snapshot_sandbox": {"sandbox_id": "sbx-0123456789"},
}
# The contract clients rely on: argument names and the required ones, per tool.
ARGUMENTS = {
    "create_sandbox": ("template timeout envs cpu memory_mb network persistent lifetime "
                       "on_timeout snapshot keep_volume secrets", ""),
    "list_sandboxes": ("template state", ""),
    "list_templates": ("", ""),
    "run_code": ("code language timeout context sandbox_id", "code"),
    "run_command": ("command workdir background timeout envs sandbox_id", "command"),
    "process_output": ("pid sandbox_id", "pid"),
    "kill_process": ("pid sandbox_id", "pid"),
    "read_file": ("path encoding offset limit sandbox_id", "path"),
    "write_file": ("path content encoding mode if_match lock_token lock_wait sandbox_id",
                   "path content"),
    "list_files": ("path depth sandbox_id", ""),
    "set_network": ("network sandbox_id", "network"),
    "pause_sandbox": ("sandbox_id", ""),
    "resume_sandbox": ("sandbox_id", ""),
    "reset_rootfs": ("sandbox_id", ""),
    "expose_port": ("sandbox_id port", "port"),
    "kill_sandbox": ("sandbox_id delete_volumes", ""),
    "lock_file": ("path ttl wait renew sandbox_id", "path"),
    "unlock_file": ("path token sandbox_id", "path token"),
    "snapshot_sandbox": ("sandbox_id name", ""),
}
MIB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _code_template() -> None:
    """Overrides the package's: nothing here needs a template built."""


def schema_of(tool: str) -> dict[str, Any]:
    return SPECS[tool].input_schema()


def arguments() -> list[tuple[str, str, dict[str, Any]]]:
    return [(tool, name, prop) for tool in SPECS
            for name, prop in schema_of(tool)["properties"].items()]


def kinds(prop: dict[str, Any]) -> set[str]:
    kind = prop["type"]
    return {kind} if isinstance(kind, str) else set(kind)


def refusal(tool: str, args: dict[str, Any]) -> str:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_args(tool, SPECS[tool].args, args)
    message = caught.value.message
    assert message.startswith(tool), message
    assert message.isascii() and len(message) < 2000, message[:300]
    return message


def accepts(tool: str, args: dict[str, Any]) -> Any:
    return parse_args(tool, SPECS[tool].args, args)


# ---- the schema clients see ------------------------------------------------------------------

def test_every_tool_is_covered() -> None:
    assert set(SPECS) == set(MINIMAL) == set(ARGUMENTS)


@pytest.mark.parametrize("tool", list(ARGUMENTS))
def test_schema_shape(tool: str) -> None:
    schema = schema_of(tool)
    names, required = (part.split() for part in ARGUMENTS[tool])
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert list(schema["properties"]) == names
    assert schema.get("required", []) == required
    text = json.dumps(schema)
    for foreign in ("$ref", "$defs", "anyOf", "allOf", "oneOf", '"title"', '"default"', "null"):
        assert foreign not in text, (tool, foreign)
    for name, prop in schema["properties"].items():
        assert prop.get("description"), (tool, name)
        assert "type" in prop, (tool, name)
        if kinds(prop) & {"integer", "number"}:
            assert "minimum" in prop and "maximum" in prop, (tool, name)
        if kinds(prop) == {"string"} and "enum" not in prop and name not in ("code", "command",
                                                                              "content"):
            assert "maxLength" in prop, (tool, name)
    jsonschema.Draft202012Validator.check_schema(schema)


def test_a_few_bounds_are_the_documented_ones() -> None:
    assert schema_of("process_output")["properties"]["pid"] == {
        "type": "integer", "minimum": 1, "maximum": 1 << 22,
        "description": "The pid run_command returned."}
    envs = schema_of("run_command")["properties"]["envs"]
    assert envs["additionalProperties"] == {"type": "string"}
    assert envs["propertyNames"]["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"
    assert schema_of("write_file")["properties"]["mode"]["type"] == "string"
    assert schema_of("read_file")["properties"]["encoding"]["enum"] == ["utf-8", "base64"]


def test_every_sandbox_tool_defaults_to_the_session_sandbox() -> None:
    for tool in set(SPECS) - {"create_sandbox", "list_sandboxes", "list_templates"}:
        prop = schema_of(tool)["properties"]["sandbox_id"]
        assert "sandbox_id" not in schema_of(tool).get("required", []), tool
        assert "default sandbox" in prop["description"], tool


def test_no_union_types_for_strict_dialects() -> None:
    """Gemini's (OpenAPI 3.0 style) schema dialect refuses a list of types."""
    from agent_sandbox.surfaces.mcp.tool_results import OUTPUT_SCHEMAS

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            assert not isinstance(node.get("type"), list), where
            assert not {"anyOf", "oneOf", "$ref", "$defs"} & set(node), where
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    for tool in SPECS:
        walk(schema_of(tool), f"{tool} input")
        walk(OUTPUT_SCHEMAS[tool], f"{tool} output")
        jsonschema.Draft202012Validator.check_schema(OUTPUT_SCHEMAS[tool])


def _subschemas(node: dict[str, Any], where: str) -> Any:
    """Every schema a value can meet below ``node``: properties, items, map values."""
    for name, sub in node.get("properties", {}).items():
        yield sub, f"{where}.{name}"
        yield from _subschemas(sub, f"{where}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield node[key], f"{where}[{key}]"
            yield from _subschemas(node[key], f"{where}[{key}]")


def test_every_schema_property_has_a_type() -> None:
    """A property without a type accepts anything (MCP Inspector's --strict warns)."""
    from agent_sandbox.surfaces.mcp.tool_results import OUTPUT_SCHEMAS

    for tool in SPECS:
        for schema, kind in ((schema_of(tool), "input"), (OUTPUT_SCHEMAS[tool], "output")):
            for sub, where in _subschemas(schema, f"{tool} {kind}"):
                assert isinstance(sub.get("type"), str), where


def test_an_error_result_conforms_to_every_output_schema() -> None:
    """The spec: structured content MUST conform to the declared schema, errors too."""
    from agent_sandbox.core.errors import NotFoundError
    from agent_sandbox.surfaces.mcp.fairness import ServerBusy
    from agent_sandbox.surfaces.mcp.server import error_result
    from agent_sandbox.surfaces.mcp.tool_results import OUTPUT_SCHEMAS

    errors = [error_result(InvalidArgumentError("'memory_mb' must be ...")),
              error_result(ServerBusy("server busy")),
              error_result(NotFoundError("no sandbox", details={"alternative": "x"}))]
    assert errors[1].structured_content["error"]["retry_after"] > 0  # type: ignore[index]
    for tool in SPECS:
        for result in errors:
            assert result.is_error and list(result.structured_content or {}) == ["error"]
            jsonschema.validate(result.structured_content, OUTPUT_SCHEMAS[tool])
    # run_code's `error` is also the cell's exception, on success.
    jsonschema.validate({"sandbox_id": "s", "error": {"name": "ZeroDivisionError",
                         "value": "division by zero", "traceback": ""}},
                        OUTPUT_SCHEMAS["run_code"])


@pytest.mark.parametrize("tool", list(MINIMAL))
def test_defaults(tool: str) -> None:
    args = accepts(tool, MINIMAL[tool])
    for name, value in MINIMAL[tool].items():
        assert getattr(args, name) == (parse_policy(value) if name == "network" else value)
    if "sandbox_id" in schema_of(tool)["properties"] and "sandbox_id" not in MINIMAL[tool]:
        assert args.sandbox_id is None  # the session's default sandbox


def test_documented_defaults() -> None:
    run = accepts("run_command", {"command": "x"})
    assert (run.workdir, run.timeout, run.background, run.envs) == ("/workspace", 60, False,
                                                                    None)
    assert accepts("create_sandbox", {}).timeout == 300
    read = accepts("read_file", {"path": "/x"})
    assert (read.encoding, read.offset, read.limit) == ("utf-8", 0, None)
    assert accepts("write_file", MINIMAL["write_file"]).mode == 0o644
    assert accepts("list_files", {}).path == "/workspace" and accepts("list_files", {}).depth == 1


# ---- bounds -------------------------------------------------------------------------------------

NUMERIC = [a for a in arguments() if kinds(a[2]) & {"integer", "number"} and "string" not in
           kinds(a[2])]
# Free-form strings (a patterned one, such as a mode, has its own test).
STRINGS = [a for a in arguments() if "maxLength" in a[2] and "pattern" not in a[2]]


@pytest.mark.parametrize(("tool", "name", "prop"), NUMERIC, ids=lambda v: str(v)[:20])
def test_numeric_bounds(tool: str, name: str, prop: dict[str, Any]) -> None:
    low, high = prop["minimum"], prop["maximum"]
    base = MINIMAL[tool]
    assert getattr(accepts(tool, {**base, name: low}), name) == low
    assert getattr(accepts(tool, {**base, name: high}), name) == high
    integer = prop["type"] == "integer"
    below = low - 1 if integer or low == 0 else low / 2
    above = high + 1 if integer else high * 2
    for bad in (below, above):
        message = refusal(tool, {**base, name: bad})
        kind = "a whole number" if integer else "a finite number"
        assert f"'{name}' must be {kind} between" in message, message
    if integer:
        assert getattr(accepts(tool, {**base, name: float(low)}), name) == low  # 7.0 is 7
        assert isinstance(getattr(accepts(tool, {**base, name: float(low)}), name), int)
        assert f"'{name}'" in refusal(tool, {**base, name: low + 0.5})


@pytest.mark.parametrize(("tool", "name", "prop"), STRINGS, ids=lambda v: str(v)[:20])
def test_string_lengths(tool: str, name: str, prop: dict[str, Any]) -> None:
    limit = prop["maxLength"]
    base = MINIMAL[tool]
    assert getattr(accepts(tool, {**base, name: "a" * limit}), name) == "a" * limit
    message = refusal(tool, {**base, name: "a" * (limit + 1)})
    assert f"'{name}' must be at most {limit} characters long" in message
    if limit >= 80:
        assert f"... ({limit + 1} characters)" in message  # shown capped, with its length


@pytest.mark.parametrize("tool", [t for t in MINIMAL if MINIMAL[t]])
def test_required_arguments(tool: str) -> None:
    for name in schema_of(tool).get("required", []):
        rest = {k: v for k, v in MINIMAL[tool].items() if k != name}
        assert f"'{name}' is required" in refusal(tool, rest)
        assert f"'{name}' is required" in refusal(tool, {**rest, name: None})  # null: left out
        if schema_of(tool)["properties"][name].get("minLength"):
            assert f"'{name}' must not be empty" in refusal(tool, {**rest, name: ""})


def test_required_hints_and_empty_content() -> None:
    assert "'pid' is required (from run_command with background=true)" in refusal(
        "process_output", {})
    assert "'content' is required (may be empty)" in refusal("write_file", {"path": "/x"})
    assert accepts("write_file", {"path": "/x", "content": ""}).content == ""


def test_null_means_the_default() -> None:
    args = accepts("run_command", {"command": "x", "timeout": None, "workdir": None,
                                   "sandbox_id": None})
    assert (args.timeout, args.workdir, args.sandbox_id) == (60, "/workspace", None)


# ---- hostile values -------------------------------------------------------------------------

SAMPLES: dict[str, Any] = {"string": "x", "number": 1.5, "integer": 7, "boolean": True,
                           "object": {"k": "v"}, "array": [1, "a"]}


def _hostile(prop: dict[str, Any]) -> list[Any]:
    values: list[Any] = [math.nan, math.inf, -math.inf, 10 ** 400, -(10 ** 400), [], [1]]
    allowed = kinds(prop) | ({"integer"} if "number" in kinds(prop) else set())
    values += [sample for kind, sample in SAMPLES.items() if kind not in allowed]
    return values


@pytest.mark.parametrize(("tool", "name", "prop"), arguments(), ids=lambda v: str(v)[:20])
def test_hostile_values_are_refused_naming_the_argument(tool: str, name: str,
                                                        prop: dict[str, Any]) -> None:
    base = MINIMAL[tool]
    for value in _hostile(prop):
        message = refusal(tool, {**base, name: value})
        assert f"'{name}'" in message, (value, message)
    if "string" in kinds(prop):
        message = refusal(tool, {**base, name: "ok \ud800 text"})
        assert f"'{name}' contains an unpaired UTF-16 surrogate" in message
    if "string" in kinds(prop) and "maxLength" in prop:
        assert f"'{name}'" in refusal(tool, {**base, name: "x" * (3 * MIB)})


def test_odd_numbers_are_shown_in_json_spelling() -> None:
    base = {"command": "true"}
    for value, spelled in ((math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")):
        assert refusal("run_command", {**base, "timeout": value}) == (
            "run_command: 'timeout' must be a finite number between 0.001 and 86400, "
            f"got {spelled}")
    assert refusal("process_output", {"pid": 10 ** 400}).endswith("got 100000... (401 digits)")
    assert refusal("process_output", {"pid": True}).endswith("got True")
    assert refusal("process_output", {"pid": "7"}).endswith("got '7'")


def test_a_huge_string_is_not_echoed_back() -> None:
    message = refusal("pause_sandbox", {"sandbox_id": "s" * (3 * MIB)})
    assert len(message) < 300 and "characters)" in message


def test_surrogates_in_names_keys_and_nested_values() -> None:
    assert "argument name" in refusal("run_command", {"command": "x", "\udc00": 1})
    assert "'envs' contains an unpaired UTF-16 surrogate (in ['A'])" in refusal(
        "run_command", {"command": "x", "envs": {"A": "\udfff"}})
    assert "the key" in refusal("run_command", {"command": "x", "envs": {"\ud800": "v"}})


def test_unknown_arguments_are_named_with_what_is_accepted() -> None:
    message = refusal("kill_process", {"pid": 3, "bogus": 1})
    assert message == ("kill_process got unknown argument(s) 'bogus'; it accepts: pid, "
                       "sandbox_id")
    assert "'bogus'" in refusal("kill_process", {"pid": 3, "bogus": None})
    many = refusal("run_command", {"command": "x", **{f"bogus{i}": i for i in range(300)}})
    assert "'bogus0'" in many and "and 295 more" in many


def test_several_problems_are_all_reported() -> None:
    message = refusal("run_command", {"command": 5, "timeout": "x", "background": 1})
    for name in ("command", "timeout", "background"):
        assert f"'{name}'" in message


def test_enums() -> None:
    assert refusal("read_file", {"path": "/x", "encoding": "latin1"}) == (
        "read_file: 'encoding' must be 'utf-8' or 'base64', got 'latin1'")
    assert "'running' or 'paused'" in refusal("list_sandboxes", {"state": "dead"})
    assert accepts("list_sandboxes", {"state": "paused"}).state == "paused"


@pytest.mark.parametrize("name", ["A-B", "1A", "A=B", "FOO\n", "", "A B"])
def test_env_names_follow_the_engine_rule(name: str) -> None:
    for tool, base in (("run_command", {"command": "x"}), ("create_sandbox", {})):
        message = refusal(tool, {**base, "envs": {name: "v"}})
        assert "'envs' has an invalid environment variable name" in message, message


def test_env_values_must_be_strings() -> None:
    assert refusal("run_command", {"command": "x", "envs": {"A": 5}}) == (
        "run_command: 'envs' must be an object of string names to string values, "
        "got {'A': 5}")
    assert accepts("run_command", {"command": "x", "envs": {"_A1": ""}}).envs == {"_A1": ""}


@pytest.mark.parametrize(("mode", "value"), [("0644", 0o644), ("0o755", 0o755), ("755", 0o755),
                                             (" 0600 ", 0o600), ("0", 0), ("7777", 0o7777),
                                             (420, None), (0, None), (7.0, None)])
def test_file_modes(mode: Any, value: int | None) -> None:
    args = {"path": "/x", "content": "", "mode": mode}
    if value is None:
        message = refusal("write_file", args)
        assert "'mode' must be an octal string such as '0644' (a string: a number" in message
    else:
        assert accepts("write_file", args).mode == value


@pytest.mark.parametrize("mode", ["", "9", "0x1f", "6_44", "1234567", "-1", 0o10000, -1, True])
def test_bad_file_modes(mode: Any) -> None:
    message = refusal("write_file", {"path": "/x", "content": "", "mode": mode})
    assert "'mode' must be an octal string such as '0644'" in message, message


# ---- the schema is the rule --------------------------------------------------------------------

PROBES: list[Any] = [0, 1, 7, 7.5, 0.001, 0.0005, 32, 64, 1024, 1025, 86400, 86401, 1 << 22,
                     (1 << 22) + 1, (1 << 53) - 1, -1, "", "x", "/workspace", "utf-8", "paused",
                     "0644", True, False, {}, {"A": "v"}, {"A-B": "v"}, {"A": 1}, [], "a" * 129]


@pytest.mark.parametrize("tool", list(MINIMAL))
def test_the_model_accepts_exactly_what_the_schema_allows(tool: str) -> None:
    """A value a client's own validator lets through is one the tool takes, and the other way
    round (write_file's mode and the network policies are the patterns the schema cannot
    spell: octal strings, host names and CIDRs; their own tests cover them)."""
    schema = schema_of(tool)
    validator = jsonschema.Draft202012Validator(schema)
    for name in schema["properties"]:
        if name in ("mode", "network"):
            continue
        for probe in PROBES:
            args = {**MINIMAL[tool], name: probe}
            by_schema = validator.is_valid(args)
            try:
                accepts(tool, args)
                by_model = True
            except InvalidArgumentError:
                by_model = False
            assert by_model == by_schema, (tool, name, probe)


@pytest.mark.parametrize("tool", ["create_sandbox", "set_network"])
def test_network_policies(tool: str) -> None:
    """One string (never a union of types): off, full, a preset or a comma list; anything
    else is refused naming the argument and what it takes. The ceiling is the tool's."""
    base = {**MINIMAL[tool]}
    for text, want in (("off", "off"), ("full", "full"), ("registries", "allowlist"),
                       ("pypi.org, *.example.com,10.0.0.0/8", "allowlist")):
        assert accepts(tool, {**base, "network": text}).network.mode == want
    assert accepts(tool, {**base, "network": "PyPI.org"}).network.allow_out == ("pypi.org",)
    for bad in (True, 1, ["pypi.org"], {"mode": "full"}):
        assert "'network' must be a string: 'off'" in refusal(tool, {**base, "network": bad})
    for bad, says in (("allowlist", "needs its entries"), ("pypi.org:443", "not understood"),
                      ("http://x.com", "not understood"), ("*", "not understood"),
                      (",", "names no entry")):
        message = refusal(tool, {**base, "network": bad})
        assert "'network' is not a network policy" in message and says in message, message
    pattern = re.compile(schema_of(tool)["properties"]["network"]["pattern"])
    assert pattern.match("pypi.org, *.x.com,10.0.0.0/8,2001:db8::/32")
    assert not pattern.match("x.com;rm -rf /")


def test_the_docs_list_every_tool() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs/mcp.md").read_text()
    listed = doc.split("Tools (", 1)[1].split(". A call", 1)[0]
    assert listed.startswith(f"{len(SPECS)}):"), listed[:10]
    assert re.findall(r"`(\w+)`", listed) == list(SPECS)
