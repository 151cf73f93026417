"""Merge-writing one server entry into a client's config file, touching nothing else.

A file we cannot read exactly (not strict JSON, invalid TOML, a shape we would have to
rewrite) is refused and left byte-identical.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.surfaces.cli.atomic import atomic_write, backup
from agent_sandbox.surfaces.cli.output import CliError


@dataclass
class Outcome:
    path: Path
    changed: bool
    backup: Path | None = None
    existed: bool = False


def _refuse(path: Path, why: str) -> CliError:
    return CliError(f"{path}: {why}. The file was left untouched; fix it (or move it away) "
                    "and run the command again.")


# ---- JSON ---------------------------------------------------------------------------------

def _strict_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _bad_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text, object_pairs_hook=_strict_pairs, parse_constant=_bad_constant)
    except json.JSONDecodeError as exc:
        raise _refuse(path, f"is not strict JSON ({exc.msg} at line {exc.lineno} column "
                            f"{exc.colno}; comments and trailing commas are not allowed)"
                      ) from None
    except ValueError as exc:
        raise _refuse(path, f"is not strict JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _refuse(path, "does not hold a JSON object at the top level")
    return data


def _json_edit(path: Path, raw: bytes, servers_key: str, name: str,
               entry: dict[str, Any] | None) -> bytes | None:
    data = load_json(path, raw)
    servers = data.get(servers_key)
    if servers is None:
        if entry is None:
            return None
        servers = data[servers_key] = {}
    if not isinstance(servers, dict):
        raise _refuse(path, f"'{servers_key}' is not a JSON object")
    if entry is None:
        if name not in servers:
            return None
        del servers[name]
    else:
        if servers.get(name) == entry:
            return None
        servers[name] = entry
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


# ---- TOML ---------------------------------------------------------------------------------

_KEY = r'(?:[A-Za-z0-9_-]+|"[^"\n]*"|\'[^\'\n]*\')'
_HEADER = re.compile(r"^\s*\[(?!\[)\s*(" + _KEY + r"(?:\s*\.\s*" + _KEY + r")*)\s*\]\s*(#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[")


def _split_key(dotted: str) -> list[str]:
    parts = re.findall(_KEY, dotted)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def toml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007F")


def toml_entry(table: str, name: str, entry: dict[str, Any]) -> str:
    head = f"{table}.{name}" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else \
        f"{table}.{toml_str(name)}"
    lines = [f"[{head}]"]
    nested: dict[str, dict[str, str]] = {}
    for key, value in entry.items():
        if isinstance(value, dict):
            nested[key] = value
        elif isinstance(value, list):
            lines.append(f"{key} = [{', '.join(toml_str(str(v)) for v in value)}]")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {toml_str(str(value))}")
    for key, table_value in nested.items():
        lines.append("")
        lines.append(f"[{head}.{key}]")
        lines.extend(f"{toml_str(k) if not re.fullmatch(r'[A-Za-z0-9_-]+', k) else k} = "
                     f"{toml_str(str(v))}" for k, v in table_value.items())
    return "\n".join(lines) + "\n"


def _without_ours(text: str, table: str, name: str) -> str:
    """The text minus every ``[table.name...]`` section (header to the next header)."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        match = _HEADER.match(line)
        if match:
            parts = _split_key(match.group(1))
            skipping = parts[:2] == [table, name]
        elif _ANY_HEADER.match(line) and line.lstrip().startswith("[["):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


def _normalized(data: dict[str, Any], table: str) -> dict[str, Any]:
    data = dict(data)
    if table in data and data[table] == {}:
        del data[table]
    return data


def _toml_edit(path: Path, raw: bytes, table: str, name: str,
               entry: dict[str, Any] | None) -> bytes | None:
    try:
        text = raw.decode("utf-8")
        before = tomllib.loads(text)
    except UnicodeDecodeError:
        raise _refuse(path, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise _refuse(path, f"is not valid TOML ({exc})") from None
    servers = before.get(table, {})
    if not isinstance(servers, dict):
        raise _refuse(path, f"'{table}' is not a table")
    if entry is None and name not in servers:
        return None
    if entry is not None and servers.get(name) == entry:
        return None
    new_text = _without_ours(text, table, name).rstrip("\n")
    if entry is not None:
        new_text = (new_text + "\n\n" if new_text else "") + toml_entry(table, name, entry)
    elif new_text:
        new_text += "\n"
    expected = json.loads(json.dumps(before, default=str))
    expected_servers = dict(servers)
    if entry is None:
        expected_servers.pop(name, None)
    else:
        expected_servers[name] = entry
    expected[table] = expected_servers
    try:
        after = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError:
        after = None
    if after is None or _normalized(json.loads(json.dumps(after, default=str)), table) != \
            _normalized(expected, table):
        raise _refuse(path, f"its [{table}.{name}] entry is written in a form this installer "
                            "does not rewrite (an inline table or dotted keys)")
    return new_text.encode()


# ---- both ---------------------------------------------------------------------------------

def merge_write(path: Path, fmt: str, servers_key: str, name: str,
                entry: dict[str, Any] | None) -> Outcome:
    """Put ``entry`` under ``servers_key.name`` (``None``: remove it) in ``path``."""
    path = Path(path)
    real = path.resolve() if path.is_symlink() else path
    try:
        raw = real.read_bytes()
        existed = True
    except FileNotFoundError:
        raw, existed = b"", False
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    if not existed and entry is None:
        return Outcome(path, changed=False)
    edit = _toml_edit if fmt == "toml" else _json_edit
    new = edit(path, raw, servers_key, name, entry)
    if new is None:
        return Outcome(path, changed=False, existed=existed)
    saved = None
    try:
        if existed:
            saved = backup(real)
        else:
            real.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(real, new, mode=0o600)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    return Outcome(path, changed=True, backup=saved, existed=existed)


def read_entry(path: Path, fmt: str, servers_key: str, name: str) -> dict[str, Any] | None:
    """Our entry as the client would read it, or None (missing or unreadable file)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        data = tomllib.loads(raw.decode()) if fmt == "toml" else load_json(path, raw)
    except (CliError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    servers = data.get(servers_key)
    if not isinstance(servers, dict):
        return None
    entry = servers.get(name)
    return entry if isinstance(entry, dict) else None
