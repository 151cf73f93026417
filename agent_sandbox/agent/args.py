"""Checking tool arguments, with messages a model can act on."""

from __future__ import annotations

from typing import Any

from agent_sandbox.errors import InvalidArgumentError


class Args:
    def __init__(self, tool: str, raw: dict[str, Any] | None, accepted: set[str]) -> None:
        self.tool = tool
        self.raw = dict(raw or {})
        unknown = sorted(set(self.raw) - accepted)
        if unknown:
            raise InvalidArgumentError(
                f"{tool} got unknown argument(s) {', '.join(unknown)}; it accepts: "
                f"{', '.join(sorted(accepted)) or 'none'}")

    def _bad(self, name: str, want: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.tool}: '{name}' must be {want}, "
                                    f"got {self.raw.get(name)!r}")

    def str(self, name: str, default: str | None = None, *, required: bool = False) -> Any:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise InvalidArgumentError(f"{self.tool}: '{name}' is required")
            return default
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        if required and not value:
            raise InvalidArgumentError(f"{self.tool}: '{name}' must not be empty")
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, "true or false")
        return value

    def num(self, name: str, default: float | None = None, *, integer: bool = False,
            minimum: float = 0) -> Any:
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, "a number")
        if integer and value != int(value):
            raise self._bad(name, "a whole number")
        if value < minimum:
            raise self._bad(name, f"at least {minimum}")
        return int(value) if integer else value

    def envs(self, name: str = "envs") -> dict[str, str] | None:
        value = self.raw.get(name)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise InvalidArgumentError(f"{self.tool}: '{name}' must be an object of string "
                                       "names to string values")
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
            try:
                value = int(text, 8)
            except ValueError:
                raise self._bad(name, "an octal string such as '0644'") from None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o7777:
            raise self._bad(name, "an octal string such as '0644' (or its integer value, 420)")
        return value
