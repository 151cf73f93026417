"""What ``abx sandbox run-code`` shows of a cell's results: each one's text on stdout, its
images (a matplotlib figure, a display()) saved with ``--save-dir`` or named on stderr.

A result's bytes come from the sandbox: they are decoded, never trusted for a name. Files
are made with names of ours (``image-K.png``, the first K free), ``O_EXCL``: nothing that
is there is replaced."""

from __future__ import annotations

import base64
import binascii
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.surfaces.cli.output import CliError, err_console

# Formats saved as files (SVG is text, the others base64), by their file extension.
SAVED = {"png": "png", "jpeg": "jpg", "svg": "svg", "pdf": "pdf"}
_MAX_TRIES = 10_000  # image-1.png ... image-10000.png, then it says so


def show(results: Sequence[Any], save_dir: Path | None, *, texts: bool = True) -> None:
    """Print each result's text (unless not ``texts``: --json has them); save (or name)
    its images. Main result or not: a figure is a display item whose text is only
    ``<Figure size ...>``."""
    unsaved: list[str] = []
    for n, result in enumerate(results, 1):
        if texts and result.text is not None:
            print(result.text)
        for name, ext in SAVED.items():
            value = getattr(result, name, None)
            if not isinstance(value, str):
                continue
            if save_dir is None:
                unsaved.append(f"result {n}: {name}")
            else:
                _save(save_dir, n, name, ext, value)
        others = [_shown(f) for f in result.formats() if f != "text" and f not in SAVED]
        if texts and result.text is None and others:
            note(f"result {n} has no text, only {', '.join(others)}: see it with --json")
    if unsaved:
        many = len(unsaved) > 1
        note(f"the cell made {len(unsaved)} image{'s' if many else ''} ({', '.join(unsaved)}):"
             f" save {'them' if many else 'it'} with --save-dir DIR")
    sys.stdout.flush()


def note(message: str) -> None:
    """To stderr as it is: no Rich markup in paths or in what the sandbox named."""
    err_console.print(message, markup=False)


def _shown(name: str) -> str:
    """A format's name (any MIME type the kernel sent) without control characters."""
    return "".join(c if c.isprintable() else "?" for c in name[:80])


def _save(save_dir: Path, n: int, name: str, ext: str, value: str) -> None:
    try:
        data = value.encode() if name == "svg" else base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        note(f"result {n}: its {name} is not valid base64 (not saved)")
        return
    path = _create(save_dir, ext)
    with os.fdopen(path[1], "wb") as f:
        f.write(data)
    note(f"saved the {name} of result {n} ({len(data)} bytes) as {path[0]}")


def _create(save_dir: Path, ext: str) -> tuple[Path, int]:
    """The first free ``image-K.ext`` in ``save_dir`` (made if missing), open for writing."""
    from agent_sandbox.surfaces.cli.fs_errors import describe, writing

    with writing(save_dir, instead="give another --save-dir"):
        save_dir.mkdir(parents=True, exist_ok=True)
    for k in range(1, _MAX_TRIES + 1):
        path = save_dir / f"image-{k}.{ext}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise CliError(describe(exc, path, instead="give another --save-dir")) from None
        return path, fd
    raise CliError(f"{save_dir} already holds image-1.{ext} to image-{_MAX_TRIES}.{ext}: "
                   "give another --save-dir")
