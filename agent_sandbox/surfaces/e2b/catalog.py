"""The templates a key sees through E2B's API, by name and by tag.

A key sees the host's templates and its own. A tag names a build of a template (E2B's
``name:tag``; ``default`` is always the latest). This engine keeps a template's latest
build only, so a tag is kept with the build it was given to and lapses when the template
is rebuilt without it: ``name:tag`` then is not found, saying so, rather than starting a
build the tag never named. Tags are kept in a file of the gateway (beside its keys)."""

from __future__ import annotations

import datetime
import json
import os
import re
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.http.state import GatewayState

DEFAULT_TAG = "default"
MAX_TAGS = 100  # per template
MAX_FILE = 16 << 20  # bytes of the tags file read back
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def e2b_time(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


def visible(state: GatewayState, who: Principal) -> list[TemplateInfo]:
    return [t for t in state.provider.list_templates()
            if who.admin or t.owner in ("", who.owner)]


def template(state: GatewayState, who: Principal, name: str) -> TemplateInfo:
    for info in visible(state, who):
        if info.name == name:
            return info
    raise NotFoundError(f"template {name!r} not found")


def check_tags(tags: list[str]) -> list[str]:
    if len(tags) > MAX_TAGS:
        raise InvalidArgumentError(f"at most {MAX_TAGS} tags")
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise InvalidArgumentError(f"tag {str(tag)[:60]!r}: use 1-128 letters, digits, "
                                       "'.', '_' or '-', starting with a letter or digit")
    return sorted(set(tags))


def split_ref(ref: str) -> tuple[str, str]:
    """``name[:tag]`` as (name, tag), the tag ``default`` when none is given."""
    name, _, tag = ref.partition(":")
    return name, tag or DEFAULT_TAG


class Tags:
    """name -> {"at": the tagged build's created_at, "build": its id, "tags": [...]}."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read(MAX_FILE) or b"{}")
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, self.path)

    def of(self, info: TemplateInfo) -> tuple[str, list[str]]:
        """The build id of ``info`` (its latest build) and its tags, ``default`` first."""
        with self.lock:
            entry = self._load().get(info.name)
        if isinstance(entry, dict) and entry.get("at") == info.created_at:
            return str(entry.get("build")), [DEFAULT_TAG, *entry.get("tags", [])]
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{info.name}@{info.created_at}")), \
            [DEFAULT_TAG]

    def change(self, info: TemplateInfo, add: Sequence[str] = (), remove: Sequence[str] = (),
               build_id: str = "", *, new_build: bool = False) -> tuple[str, list[str]]:
        """Tags of ``info``'s build: ``add`` and ``remove`` them (a new build's replace
        those of the build before)."""
        with self.lock:
            data = self._load()
            entry = data.get(info.name)
            if new_build or not isinstance(entry, dict) or entry.get("at") != info.created_at:
                entry = {"at": info.created_at, "build": build_id or str(uuid.uuid5(
                    uuid.NAMESPACE_URL, f"{info.name}@{info.created_at}")), "tags": []}
            tags = set(entry["tags"]) | set(add)
            tags -= set(remove) | {DEFAULT_TAG}
            entry["tags"] = check_tags(sorted(tags))
            data[info.name] = entry
            self._save(data)
        return entry["build"], [DEFAULT_TAG, *entry["tags"]]

    def resolve(self, state: GatewayState, who: Principal, ref: str) -> str:
        """The template ``name:tag`` names (its name), or NotFoundError saying why."""
        name, tag = split_ref(ref)
        info = template(state, who, name)
        if tag not in self.of(info)[1]:
            raise NotFoundError(f"template {name!r} has no tag {tag!r} (this gateway keeps a "
                                "template's latest build only: a tag given to an earlier build "
                                "lapses when the template is rebuilt without it)")
        return name


def tags_for(state: GatewayState) -> Tags:
    """The tags of ``state``'s gateway (made once, with its app)."""
    return Tags(state.keys.path.parent / "e2b-template-tags.json")
