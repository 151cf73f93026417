"""Paths as envd takes them: absolute, or relative to the user's home (``file.txt`` is
``/home/user/file.txt`` for E2B's default user ``user``, ``/root/file.txt`` for root), ``~``
and ``~/...`` too. The default user is E2B's and our guest's: ``user`` (uid 1000, home
/home/user, made on first use by guest/users.py)."""

from __future__ import annotations

import posixpath

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.surfaces.rest.schemas import checked_path

DEFAULT_USER = "user"


def username(given: str | None) -> str:
    """The account a request names (None or empty: the default one)."""
    return validate.user(given or None) or DEFAULT_USER


def home(user: str | None) -> str:
    name = username(user)
    return "/root" if name == "root" else f"/home/{name}"


def resolve(path: str, user: str | None, what: str = "path") -> str:
    """``path`` made absolute and normalized, checked as the gateway checks paths."""
    if "\x00" in path:
        raise InvalidArgumentError(f"{what} contains a NUL byte")
    if path == "~" or path.startswith("~/"):
        path = home(user) + path[1:]
    elif not path.startswith("/"):
        path = posixpath.join(home(user), path)
    path = "/" + posixpath.normpath(path).lstrip("/")  # normpath keeps a leading '//'
    return checked_path(path, what)
