"""``~/.abx/config`` and credential resolution: process environment, then ./.env, then ~/.abx.

The settings themselves are ``agent_sandbox.config.settings.Settings``; the ones marked there with a
``config_key`` can also be kept in ~/.abx/config or ./.env (``KEYS``).
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.config.settings import Settings, SettingsError, check_value, env_name, extra_of
from agent_sandbox.surfaces.cli.atomic import atomic_write
from agent_sandbox.surfaces.cli.config_files import (
    ConfigFileError,
    config_path,
    parse_config,
    read_dotenv,
)
from agent_sandbox.surfaces.cli.output import CliError, UsageError


@dataclass(frozen=True)
class Key:
    name: str
    field: str  # of agent_sandbox.config.settings.Settings
    secret: bool
    help: str

    @property
    def env(self) -> str:
        return env_name(self.field)


def _config_keys() -> dict[str, Key]:
    """The settings ``abx config`` can keep: those the model marks with a ``config_key``."""
    keys = {}
    for name, field in Settings.model_fields.items():
        key = extra_of(name).get("config_key")
        if isinstance(key, str):
            keys[key] = Key(key, name, bool(extra_of(name).get("secret")),
                            field.description or "")
    return keys


KEYS: dict[str, Key] = _config_keys()


@functools.cache
def env_settings() -> Settings:
    """The settings as this process's environment has them (read once per ``abx`` run)."""
    try:
        return Settings()
    except SettingsError as exc:
        raise CliError(exc.message, 2) from None


@functools.cache
def cli_settings() -> Settings:
    """The settings of this ``abx`` run: the environment, and for the ``abx config`` keys
    it leaves unset, ./.env then ~/.abx/config."""
    overlay = {}
    for name, key in KEYS.items():
        r = resolve(name)
        if r.source in ("dotenv", "config"):
            _check_saved(name, key, r)
            overlay[key.field] = r.value
    if not overlay:
        return env_settings()
    try:
        return Settings(**overlay)
    except SettingsError as exc:
        raise CliError(f"{exc.message} (from ./.env or {config_path()})", 2) from None


def _check_saved(name: str, key: Key, r: Resolved) -> None:
    where = "./.env" if r.source == "dotenv" else str(config_path())
    try:
        check_value(key.field, r.value or "")
    except SettingsError as exc:
        fix = (f"fix {key.env} in ./.env" if r.source == "dotenv" else
               f"fix it with `abx config set {name} VALUE` or `abx config unset {name}`")
        raise CliError(f"{name} from {where}: {exc.message}; {fix}", 2) from None


def key_of(name: str) -> Key:
    key = KEYS.get(name)
    if key is None:
        raise UsageError(f"unknown key {name!r}; known keys: {', '.join(KEYS)}")
    return key


def read_config() -> dict[str, str]:
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return parse_config(text, path)
    except ConfigFileError as exc:
        raise CliError(str(exc)) from None


def write_config(data: dict[str, str], instead: str = "") -> Path:
    """Save ~/.abx/config; ``instead`` is the way around it a failure suggests."""
    from agent_sandbox.surfaces.cli.fs_errors import writing

    path = config_path()
    with writing(path, instead=instead or "use the environment variables instead (`abx "
                 "config list` names them)"):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                     mode=0o600, force_mode=True)
    return path


@dataclass(frozen=True)
class Resolved:
    key: Key
    value: str | None
    source: str | None  # "env", "dotenv", "config" or None


def resolve(name: str) -> Resolved:
    """One setting, from the first place that has a non-empty value."""
    key = key_of(name)
    settings = env_settings()
    value = str(getattr(settings, key.field) or "").strip()
    if value and key.field in settings.model_fields_set:
        return Resolved(key, value, "env")
    value = read_dotenv().get(key.env, "").strip()
    if value:
        return Resolved(key, value, "dotenv")
    with contextlib.suppress(CliError):
        value = read_config().get(name, "").strip()
        if value:
            return Resolved(key, value, "config")
    return Resolved(key, None, None)
