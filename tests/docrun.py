"""Runs one Python example of the docs as ``__main__`` (``python docrun.py EXAMPLE.py``), for
tests/test_docs.py, with one change to the world it runs in and none to its code: every
sandbox the example creates gets pip pointed at the test's stand-in package index
(``PIP_INDEX_URL`` and ``PIP_TRUSTED_HOST`` in its environment, from ``ABX_DOCS_PIP_INDEX``),
where a reader's pip finds PyPI. Whether pip may reach it is still the sandbox's network
policy: for sandboxes, the index's host is pypi.org (ABX_NETWORK_HOSTS)."""

from __future__ import annotations

import os
import runpy
import sys
import urllib.parse
from typing import Any


def _point_pip_at(index: str) -> None:
    from agent_sandbox.sdk.sandbox import Sandbox

    pip = {"PIP_INDEX_URL": index, "PIP_TRUSTED_HOST": urllib.parse.urlsplit(index).hostname}
    create = Sandbox.create.__func__  # type: ignore[attr-defined]

    def with_pip(cls: type, *args: Any, **kwargs: Any) -> Any:
        kwargs["envs"] = {**pip, **(kwargs.get("envs") or {})}
        return create(cls, *args, **kwargs)

    Sandbox.create = classmethod(with_pip)  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    index = os.environ.pop("ABX_DOCS_PIP_INDEX", "")
    if index:
        _point_pip_at(index)
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
