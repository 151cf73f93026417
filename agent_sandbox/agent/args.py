"""Checking tool arguments, with messages a model can act on.

Every message names the tool and the argument, says what is expected and shows what was
given, capped (a few MiB of argument never comes back in an error) and ASCII-safe.
"""

from __future__ import annotations

import math
import re
from typing import Any

from agent_sandbox.errors import InvalidArgumentError

_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN = 80  # characters of a bad value shown back


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


def _plain(number: float) -> str:
    return f"{number:g}" if isinstance(number, float) and number < 1e16 else str(number)


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


class Args:
    """``accepted``: the tool's input-schema properties (their ``minimum``, ``maximum`` and
    ``maxLength`` are enforced, so the schema a client sees is the rule), or bare names."""

    def __init__(self, tool: str, raw: dict[str, Any] | None,
                 accepted: set[str] | dict[str, Any]) -> None:
        self.tool = tool
        self.raw = dict(raw or {})
        self.schema: dict[str, Any] = accepted if isinstance(accepted, dict) else {}
        for name, value in self.raw.items():
            if _SURROGATE.search(name):
                raise InvalidArgumentError(
                    f"{tool}: an argument name ({ascii(name[:40])}) contains an unpaired UTF-16 "
                    "surrogate, which is not valid Unicode")
            where = _surrogate_in(value)
            if where is not None:
                raise InvalidArgumentError(
                    f"{tool}: '{name}' contains an unpaired UTF-16 surrogate (in {where}), "
                    "which is not valid Unicode; send valid text (binary data as base64)")
        unknown = sorted(set(self.raw) - set(accepted))
        if unknown:
            names = ", ".join(shown(n) for n in unknown[:5]) + (
                f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise InvalidArgumentError(
                f"{tool} got unknown argument(s) {names}; it accepts: "
                f"{', '.join(sorted(accepted)) or 'none'}")

    def _bad(self, name: str, want: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.tool}: '{name}' must be {want}, "
                                    f"got {shown(self.raw.get(name))}")

    def str(self, name: str, default: str | None = None, *, required: bool = False) -> Any:
        value = self.raw.get(name)
        max_len = self.schema.get(name, {}).get("maxLength")
        if value is None:
            if required:
                raise InvalidArgumentError(f"{self.tool}: '{name}' is required")
            return default
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        if required and not value:
            raise InvalidArgumentError(f"{self.tool}: '{name}' must not be empty")
        if max_len is not None and len(value) > max_len:
            raise self._bad(name, f"at most {max_len} characters long")
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, "true or false")
        return value

    def num(self, name: str, default: float | None = None) -> Any:
        """A finite number within the schema's [minimum, maximum] (whole if "integer")."""
        value = self.raw.get(name)
        if value is None:
            return default
        rule = self.schema[name]
        integer = rule["type"] == "integer"
        minimum, maximum = rule["minimum"], rule["maximum"]
        kind = "a whole number" if integer else "a finite number"
        want = f"{kind} between {_plain(minimum)} and {_plain(maximum)}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, want)
        if isinstance(value, float) and not math.isfinite(value):
            raise self._bad(name, want)
        if not minimum <= value <= maximum:
            raise self._bad(name, want)
        if integer and isinstance(value, float) and not value.is_integer():
            raise self._bad(name, want)
        return int(value) if integer else value

    def envs(self, name: str = "envs") -> dict[str, str] | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise InvalidArgumentError(f"{self.tool}: '{name}' must be an object of string "
                                       f"names to string values, got {shown(value)}")
        return value

    def choice(self, name: str, options: tuple[str, ...]) -> str:
        value = self.str(name, options[0])
        if value not in options:
            raise self._bad(name, " or ".join(repr(o) for o in options))
        return value

    def mode(self, name: str = "mode", default: int = 0o644) -> int:
        """A permission mode: an octal string ('0644', '0o755', '644') or its integer value."""
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, str):
            text = value.strip().lower().removeprefix("0o")
            if not 0 < len(text) <= 6:
                raise self._bad(name, "an octal string such as '0644'")
            try:
                value = int(text, 8)
            except ValueError:
                raise self._bad(name, "an octal string such as '0644'") from None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o7777:
            raise self._bad(name, "an octal string such as '0644' (or its integer value, 420)")
        return value
