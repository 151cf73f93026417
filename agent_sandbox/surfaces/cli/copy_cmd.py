"""``abx sandbox upload`` and ``download``: files and directories in and out, with the
destination rules of ``cp -r`` and ``docker cp``.

- An existing directory as the destination receives the source under its own name
  (``download S /workspace/data.csv .`` writes ``./data.csv``).
- A source ending in ``/.`` (or ``.`` itself) copies the directory's contents instead.
- A destination ending in ``/`` must be an existing directory; a new destination's
  parent must exist locally (the sandbox side makes parents).
- Paths in the sandbox that are not absolute are taken under ``/workspace``.
- ``-`` is stdin (upload) or stdout (download), for a single file.
"""

from __future__ import annotations

import os
import posixpath
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from agent_sandbox.surfaces.cli.output import CliError, console, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import connect

WORKDIR = "/workspace"
IdArg = Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _sandbox(sandbox_id: str) -> Any:
    return connect(sandbox_id)


def _remote_path(path: str) -> tuple[str, str]:
    """The sandbox path made absolute (relative ones are under /workspace) and normalised,
    and how it ended: ``/.`` (a directory's contents), ``/`` (must be a directory) or ``""``."""
    if not path:
        raise CliError("the path in the sandbox is empty; give one such as /workspace/x", 2)
    full = path if path.startswith("/") else posixpath.join(WORKDIR, path)
    norm = "/" + posixpath.normpath(full).lstrip("/")
    if path == "." or full.endswith("/."):
        return norm, "/."
    return norm, "/" if full.endswith("/") and norm != "/" else ""


def _contents_only(path: str) -> bool:
    return path == "." or path.endswith("/.")


def _base(path: str) -> str:
    """The name a copy takes inside an existing directory ("" for the root)."""
    return posixpath.basename(posixpath.normpath(path))


def _remote_kind(sb: Any, path: str) -> str | None:
    """``dir``, ``file`` (anything else) or None (missing); a symlink is what it points to."""
    from agent_sandbox.core.errors import NotFoundError

    try:
        entry = sb.files.stat(path)
    except NotFoundError:
        return None
    if entry.type == "symlink":
        return "dir" if sb.files.exists(path.rstrip("/") + "/.") else "file"
    return "dir" if entry.type == "dir" else "file"


def safe(text: str) -> str:
    """A note from a sandbox, fit for a terminal: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _report(verb: str, where: str, result: Any, json_out: bool) -> None:
    if want_json(json_out):
        print_json({"path": where, **result.model_dump()})
        return
    for note in result.skipped:
        print(f"warning: {safe(note)}", file=sys.stderr)
    counts = ", ".join(_count(n, word) for n, word in (
        (result.files, "file"), (result.dirs, "directory"), (result.symlinks, "symlink")))
    console.print(f"{verb} {counts} ({result.size} bytes) {safe(where)}", markup=False,
                  highlight=False)


def _count(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def upload(sandbox_id: IdArg,
           local: Annotated[str, typer.Argument(help="Local file or directory ('-': stdin; "
                                                "'dir/.': the directory's contents).")],
           remote: Annotated[str, typer.Argument(help="Path inside the sandbox (relative: "
                                                 "under /workspace).")],
           mode: Annotated[str, typer.Option(help="Octal permissions of an uploaded "
                                             "file.")] = "0644",
           user: Annotated[str | None, typer.Option(
               "--user", "-u", help="Account in the sandbox that what is uploaded (and the "
                                    "directories made for it) belongs to, e.g. 'user' "
                                    "(default root; a replaced file keeps its owner).")]
           = None,
           if_match: Annotated[str | None, typer.Option(
               "--if-match", help="Write the file only if it is still at this version "
                                  "(`download --json` or `files stat` shows it); else fail "
                                  "with a conflict.")] = None,
           lock_wait: Annotated[float | None, typer.Option(
               "--lock-wait", help="Seconds to wait for another write or lock of the file "
                                   "to end (default 3).")] = None,
           lock_token: Annotated[str | None, typer.Option(
               "--lock-token", help="The token of your own lock on the file.")] = None,
           json_out: JsonOpt = False) -> None:
    """Copy a local file or directory into a sandbox (streamed; like `docker cp`)."""
    try:
        perms = int(mode, 8)
    except ValueError:
        raise CliError(f"--mode must be octal like 0644, got {mode!r}", 2) from None
    guard = {"if_match": if_match, "lock_wait": lock_wait, "lock": lock_token}
    dest, tail = _remote_path(remote)
    sb = _sandbox(sandbox_id)
    kind = _remote_kind(sb, dest)
    to_file = local == "-" or not os.path.isdir(local)
    if tail and (kind == "file" or (kind is None and to_file)):
        raise CliError(f"{sandbox_id}:{dest} is not a directory (make it first, or drop "
                       f"the trailing {tail})", 2)
    if local == "-":
        if kind == "dir":
            raise CliError(f"{sandbox_id}:{dest} is a directory; stdin goes to a file path", 2)
        _uploaded(sandbox_id, dest, sb.files.write(dest, sys.stdin.buffer, mode=perms,
                                                   user=user, **guard), json_out)
        return
    src = Path(local)
    if not os.path.lexists(src):
        raise CliError(f"{local}: no such file or directory", 2)
    if src.is_dir():
        if any(v is not None for v in guard.values()):
            raise CliError("--if-match, --lock-wait and --lock-token are for one file, not "
                           "a directory", 2)
        if kind == "file":
            raise CliError(f"cannot copy the directory {local} onto the file "
                           f"{sandbox_id}:{dest}", 2)
        target = dest
        if kind == "dir" and not _contents_only(local) and tail != "/.":
            target = posixpath.join(dest, _base(os.path.abspath(local)))
        result = sb.files.upload_dir(src, target, user=user)
        _report("uploaded", f"to {sandbox_id}:{target}", result, json_out)
        return
    if not src.is_file():
        raise CliError(f"{local} is not a regular file or a directory", 2)
    if kind == "dir":
        dest = posixpath.join(dest, src.name)
    try:
        with src.open("rb") as fh:
            size = sb.files.write(dest, fh, mode=perms, user=user, **guard)
    except OSError as exc:
        raise CliError(f"{local}: {exc.strerror or exc}") from None
    _uploaded(sandbox_id, dest, size, json_out)


def _uploaded(sandbox_id: str, dest: str, size: int, json_out: bool) -> None:
    if want_json(json_out):
        print_json({"path": dest, "size": size})
    else:
        console.print(f"uploaded {size} bytes to {sandbox_id}:{dest}", markup=False,
                      highlight=False)


def download(sandbox_id: IdArg,
             remote: Annotated[str, typer.Argument(help="File or directory in the sandbox "
                                                  "(relative: under /workspace; 'dir/.': "
                                                  "its contents).")],
             local: Annotated[str, typer.Argument(help="Local destination ('.' works; '-': "
                                                 "stdout, for a file).")],
             json_out: JsonOpt = False) -> None:
    """Copy a file or directory out of a sandbox (streamed; like `docker cp`). What the
    sandbox sends is never written outside the destination."""
    src, tail = _remote_path(remote)
    sb = _sandbox(sandbox_id)
    kind = _remote_kind(sb, src)
    if kind is None:
        raise CliError(f"{sandbox_id}:{src}: no such file or directory")
    if tail and kind != "dir":
        raise CliError(f"{sandbox_id}:{src} is not a directory (drop the trailing {tail})", 2)
    if local == "-":
        if kind == "dir":
            raise CliError(f"{sandbox_id}:{src} is a directory; give a local directory, "
                           "not '-'", 2)
        for chunk in sb.files.read(src, format="stream"):
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    dest = _local_dest(local, src, kind == "dir", tail == "/.", sandbox_id)
    if kind == "dir":
        result = sb.files.download_dir(src, dest)
        _report("downloaded", f"to {dest}", result, json_out)
        return
    size, version = _download_file(sb, src, Path(dest))
    if want_json(json_out):
        print_json({"path": dest, "size": size, "version": version})
    else:  # the version: what upload --if-match takes
        console.print(f"downloaded {size} bytes to {safe(dest)} (version {version})",
                      markup=False, highlight=False)


def _local_dest(local: str, src: str, is_dir: bool, contents: bool, sandbox_id: str) -> str:
    if os.path.isdir(local):
        name = "" if contents else _base(src)
        return os.path.join(local, name) if name else local
    if os.path.lexists(local):
        if is_dir:
            raise CliError(f"cannot copy the directory {sandbox_id}:{src} onto the file "
                           f"{local}", 2)
        return local  # a file (or a link) there is replaced, never written through
    if local.endswith(os.sep):
        raise CliError(f"{local} is not a directory (make it first, or drop the trailing "
                       f"{os.sep})", 2)
    parent = os.path.dirname(os.path.abspath(local))
    if not os.path.isdir(parent):
        raise CliError(f"{parent} does not exist (make it first: mkdir -p {parent})", 2)
    return local


def _download_file(sb: Any, src: str, local: Path) -> tuple[int, str | None]:
    chunks = sb.files.read(src, format="stream")
    tmp = local.with_name(f".{local.name}.abx-part")
    size = 0
    try:
        tmp.unlink(missing_ok=True)  # left by an interrupted download
        with tmp.open("xb") as fh:
            for chunk in chunks:
                fh.write(chunk)
                size += len(chunk)
        tmp.replace(local)
    except OSError as exc:
        raise CliError(f"{local}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return size, getattr(chunks, "version", None)
