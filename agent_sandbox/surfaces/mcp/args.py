"""Tool arguments: one pydantic model per tool is both the schema clients see and the check.

``ToolArgs`` subclasses (in ``tool_args``) declare each argument once; ``tool_schema`` turns
one into the plain object schema MCP clients take, and ``parse_args`` validates a call's
arguments with the same model. Every refusal names the tool and the argument, says what is
accepted and shows what was given, capped (a few MiB of argument never comes back in an
error) and ASCII-safe.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from agent_sandbox.core.errors import InvalidArgumentError

_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN = 80  # characters of a bad value shown back
_MAX_REPORTED = 5  # problems listed in one refusal
REFUSAL = "tool_argument"  # the pydantic error type of a validator's own message


class ToolArgs(BaseModel):
    """A tool's arguments. Strict: no string is taken for a number, no 1 for true; NaN and
    the infinities are refused; unknown names are refused before the model sees them."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    # What to add when a required argument is missing: "(may be empty)".
    required_hints: ClassVar[dict[str, str]] = {}


Args = TypeVar("Args", bound=ToolArgs)


def refuse(want: str = "", *, says: str = "") -> PydanticCustomError:
    """A validator's refusal: ``want`` reads "'arg' must be <want>, got <value>"; ``says``
    replaces everything after "'arg'"."""
    return PydanticCustomError(REFUSAL, "{want}{says}", {"want": want, "says": says})


def shown(value: Any) -> str:
    """A value for an error message: JSON spellings for the odd numbers, capped reprs."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        digits = len(str(abs(value)))
        return f"{'-' if value < 0 else ''}{str(abs(value))[:6]}... ({digits} digits)"
    if isinstance(value, str) and len(value) > _SHOWN:
        return ascii(value[:_SHOWN]) + f"... ({len(value)} characters)"
    text = ascii(value) if isinstance(value, str) else repr(value)
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "..."
    return text


# ---- the schema clients see -----------------------------------------------------------------

def _plain_property(prop: dict[str, Any]) -> dict[str, Any]:
    """One property as clients take it: ``X | None`` is just X (a null means "the default"),
    no titles, no defaults (the descriptions say them)."""
    prop = dict(prop)
    branches = [b for b in prop.pop("anyOf", []) if b != {"type": "null"}]
    if len(branches) > 1:
        raise TypeError(f"an argument must have one schema, got {branches}")
    if branches:
        prop = {**branches[0], **prop}
    for noise in ("title", "default"):
        prop.pop(noise, None)
    return prop


def tool_schema(model: type[ToolArgs]) -> dict[str, Any]:
    """The tool's input schema: a flat object schema (no $defs, no anyOf)."""
    generated = model.model_json_schema()
    if "$defs" in generated:
        raise TypeError(f"{model.__name__}: tool arguments must not nest models")
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: _plain_property(prop)
                       for name, prop in generated["properties"].items()},
        "additionalProperties": False}
    if generated.get("required"):
        schema["required"] = list(generated["required"])
    return schema


# ---- checking a call's arguments ------------------------------------------------------------

def _surrogate_in(value: Any) -> str | None:
    """Where in ``value`` (a JSON value) an unpaired UTF-16 surrogate hides, if anywhere."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where or "its value"
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return f"the key {ascii(key[:40])}"
                stack.append((sub, f"{where}[{ascii(key[:40])}]"))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}[{i}]") for i, sub in enumerate(item))
    return None


def _refuse_unreadable(tool: str, raw: dict[str, Any], accepted: set[str]) -> None:
    """Text that is not valid Unicode, then names the tool does not take."""
    for name, value in raw.items():
        if _SURROGATE.search(name):
            raise InvalidArgumentError(
                f"{tool}: an argument name ({ascii(name[:40])}) contains an unpaired UTF-16 "
                "surrogate, which is not valid Unicode")
        where = _surrogate_in(value)
        if where is not None:
            raise InvalidArgumentError(
                f"{tool}: '{name}' contains an unpaired UTF-16 surrogate (in {where}), "
                "which is not valid Unicode; send valid text (binary data as base64)")
    unknown = sorted(set(raw) - accepted)
    if unknown:
        names = ", ".join(shown(n) for n in unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise InvalidArgumentError(
            f"{tool} got unknown argument(s) {names}; it accepts: "
            f"{', '.join(sorted(accepted)) or 'none'}")


def _plain(number: float) -> str:
    return f"{number:g}" if isinstance(number, float) and number < 1e16 else str(number)


def _accepted(prop: dict[str, Any]) -> str:
    """What a property accepts, in words, from the schema clients see."""
    if "enum" in prop:
        return " or ".join(repr(option) for option in prop["enum"])
    kind = prop.get("type")
    if kind in ("integer", "number"):
        what = "a whole number" if kind == "integer" else "a finite number"
        return f"{what} between {_plain(prop['minimum'])} and {_plain(prop['maximum'])}"
    if kind == "boolean":
        return "true or false"
    if kind == "object":
        return "an object of string names to string values"
    return "a string"


def _problem(model: type[ToolArgs], schema: dict[str, Any], raw: dict[str, Any],
             error: ErrorDetails) -> str:
    name = str(error["loc"][0]) if error["loc"] else "arguments"
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "missing":
        hint = model.required_hints.get(name)
        return f"'{name}' is required" + (f" ({hint})" if hint else "")
    if kind == "string_too_short":
        return f"'{name}' must not be empty"
    if kind == REFUSAL and ctx.get("says"):
        return f"'{name}' {ctx['says']}"
    if kind == REFUSAL:
        want = ctx["want"]
    elif kind == "string_too_long":
        want = f"at most {ctx['max_length']} characters long"
    else:
        want = _accepted(schema["properties"].get(name, {}))
    return f"'{name}' must be {want}, got {shown(raw.get(name))}"


def parse_args(tool: str, model: type[Args], raw: dict[str, Any] | None) -> Args:
    """``raw`` checked by ``model``; an argument sent as null is taken as left out."""
    raw = raw or {}
    _refuse_unreadable(tool, raw, set(model.model_fields))
    given = {name: value for name, value in raw.items() if value is not None}
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        schema = tool_schema(model)
        problems: list[str] = []
        for error in exc.errors(include_url=False, include_input=False):
            problem = _problem(model, schema, given, error)
            if problem not in problems:
                problems.append(problem)
        raise InvalidArgumentError(f"{tool}: " + "; ".join(problems[:_MAX_REPORTED])) from None
