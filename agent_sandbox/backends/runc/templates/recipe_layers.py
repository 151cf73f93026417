"""Recipe layers on this host: content-addressed directories stacked as overlay lowers.

A built step is ``<templates>/.layers/<key>/`` holding one directory per template layer
target it changed (``_`` is ``/``, ``_usr`` is ``/usr``...). The key is a hash of the
parent's key, the instruction and its inputs: an unchanged prefix of a recipe finds its
layers here and is not rebuilt, and two templates with a common prefix share them. A layer
is made under a ``.tmp-layer-<pid>-<ns>`` name and renamed into place whole (a dead build's
leftovers are swept by the store), so a key that exists is a finished layer.

Everything read out of layers goes through descriptors (``openat2`` beneath a lower, no
link followed): a layer captured from a ``RUN`` is what a sandbox wrote.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from agent_sandbox.backends.runc.oci import image as oci_image
from agent_sandbox.backends.runc.oci.layers import apply_layer
from agent_sandbox.backends.runc.rootfs.confined import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    UnsafePathError,
    openat2,
)
from agent_sandbox.backends.runc.templates import layer_diff, template_view
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.backends.runc.templates.template_view import (
    lookup,
    make_dirs,
    target_dirname,
    target_of,
)
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    WrongStateError,
)
from agent_sandbox.core.recipe import image_registry
from agent_sandbox.core.templates import Layer, Template, validate_name

LAYERS = ".layers"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PASSWD_MAX = 1 << 20


def digest_of(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


class RecipeLayers:
    def __init__(self, store: TemplateStore, *, max_layer_bytes: int,
                 max_context_bytes: int) -> None:
        self.store = store
        self.root = store.root / LAYERS
        self.root.mkdir(mode=0o700, exist_ok=True)
        # Layers keep a RUN's setuid files: nobody but the engine may reach them.
        os.chmod(self.root, 0o700)
        self.max_layer_bytes = max_layer_bytes
        self.max_context_bytes = max_context_bytes

    # the cache ---------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return (self.root / key).is_dir()

    def identity(self, tmpl: Template) -> list[object]:
        """What a recipe's ``FROM tmpl`` is keyed by: its layers, with base's written as
        "base". Base is the host's OS as it is now: a package upgraded in /usr or a user
        added to /etc keeps the cache, as a registry's image does until pulled again."""
        return [(layer.target, ["base" if self.store.is_base_lower(lower) else lower
                                for lower in layer.lowers])
                for layer in tmpl.layers]

    def compose(self, parent: Template, keys: list[str]) -> list[Layer]:
        """The parent's layers with the keys' directories on top (the last key topmost)."""
        out = []
        for layer in parent.layers:
            name = target_dirname(layer.target)
            ours = [str(self.root / k / name) for k in reversed(keys)
                    if (self.root / k / name).is_dir()]
            out.append(Layer(layer.target, [*ours, *layer.lowers]))
        return out

    @contextmanager
    def making(self, key: str) -> Iterator[Path]:
        """A staging directory renamed to the layer ``key`` when the block succeeds."""
        with self._private(".tmp-layer") as staging:
            os.chmod(staging, 0o755)
            yield staging
            (staging / ".size").write_text(str(_du(staging)))
            try:
                os.rename(staging, self.root / key)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise  # else another build made the same layer first: same content

    def size(self, key: str) -> int:
        """The layer's bytes on disk (counted once, when it was made)."""
        try:
            return int((self.root / key / ".size").read_text())
        except (OSError, ValueError):
            return _du(self.root / key)

    @contextmanager
    def building(self, name: str) -> Iterator[None]:
        """One build of a name at a time (a second is refused, never interleaved); and
        no prune while any build runs."""
        validate_name(name)
        with open(self.root / f".build-{name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WrongStateError(f"template {name!r} is being built by another build; "
                                      "wait for it to finish") from None
            with open(self.root / ".prune.lock", "a") as prune:
                fcntl.flock(prune, fcntl.LOCK_SH)
                yield

    def prune(self, forget: Callable[[list[str]], None], lowers_in_use: set[str]
              ) -> tuple[int, int]:
        """Remove the layers no template and no sandbox (``lowers_in_use``: its record's
        lowers; a replaced template's sandboxes run on) uses: (layers, bytes) removed."""
        used: set[str] = {Path(p).parent.name for p in lowers_in_use
                          if Path(p).parent.parent == self.root}
        for tmpl in self.store.list():
            used.update(tmpl.build_inputs.get("recipe_layers", []))
        removed, freed = 0, 0
        with open(self.root / ".prune.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # not while a build is adding layers
            for entry in sorted(self.root.iterdir()):
                if entry.name.startswith(".") or entry.name in used:
                    continue
                freed += self.size(entry.name)
                forget([str(p) for p in entry.iterdir()])
                trash = self.store.root / f".trash-layer-{os.getpid()}-{time.time_ns()}"
                os.rename(entry, trash)
                shutil.rmtree(trash, ignore_errors=True)
                removed += 1
        return removed, freed

    @contextmanager
    def unpacked(self, archives: list[bytes]) -> Iterator[Path]:
        """A build context sent as a tar (gzip or not) unpacked into a private directory
        of the store (swept if this process dies), trusting none of its members: the
        image importer's rules (no absolute path, no '..', links never followed out)."""
        import io
        import tarfile

        with self._private(".tmp-context") as ctx:
            try:
                total = 0
                for archive in archives:
                    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
                        total += sum(m.size for m in tar.getmembers())  # before any write
                        if total > self.max_context_bytes:
                            raise ResourceExhaustedError(
                                f"the build context is over {self.max_context_bytes >> 20} "
                                "MiB unpacked")
                        apply_layer(tar, ctx)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise InvalidArgumentError(f"the build context is not a readable tar "
                                           f"archive: {exc}") from None
            yield ctx

    @contextmanager
    def _private(self, kind: str) -> Iterator[Path]:
        """A directory of the store named ``<kind>-<pid>-<ns>``: deleted after the block,
        or by the store's sweep once this process is gone (a SIGKILL mid-build)."""
        where = self.store.root / f"{kind}-{os.getpid()}-{time.time_ns()}"
        where.mkdir(mode=0o700)
        try:
            yield where
        finally:
            shutil.rmtree(where, ignore_errors=True)

    # FROM --------------------------------------------------------------------------------
    def from_image(self, source: str, say: Callable[[str], None], *,
                   registry_only: bool = False, auth: tuple[str, str] | None = None
                   ) -> tuple[Template, str]:
        """FROM an image archive or a registry reference (pulled with skopeo; only that
        when ``registry_only``, with ``auth`` = (user, password) if given): its root
        filesystem as a layer of ``/``, cached by the image's bytes."""
        path = Path(source)
        with self._private(".tmp-pull") as tmp:
            if not registry_only and path.is_file():
                archive = path
            else:
                archive = Path(tmp) / "image.tar"
                say(f"pulling {source} with skopeo")
                skopeo = shutil.which("skopeo")
                if skopeo is None:
                    raise NotFoundError(f"FROM {source}: not a local template or image "
                                        "archive, and skopeo (to pull it) is not installed "
                                        "(scripts/setup.sh installs it)")
                # No file it writes (the archive) grows past what a layer may hold.
                args = ["prlimit", f"--fsize={self.max_layer_bytes}", "--", skopeo, "copy",
                        "--quiet"]
                if auth is not None:  # in a 0600 file, never on a command line
                    args += ["--src-authfile", _authfile(Path(tmp), source, auth)]
                else:  # not the host's own logins (a tenant's pull must not use them)
                    args += ["--src-no-creds"] if registry_only else []
                proc = subprocess.run([*args, f"docker://{source}", f"oci-archive:{archive}"],
                                      capture_output=True, text=True, timeout=1800,
                                      stdin=subprocess.DEVNULL)
                if proc.returncode == -signal.SIGXFSZ or "file too large" in proc.stderr:
                    raise ResourceExhaustedError(
                        f"FROM {source}: the image is over {self.max_layer_bytes >> 20} MiB "
                        "(ABX_BUILD_MAX_LAYER_MB)")
                if proc.returncode != 0:
                    raise NotFoundError(f"FROM {source}: not a local template, not an image "
                                        f"archive, and pulling it failed: "
                                        f"{_skopeo_error(proc.stderr)}")
            key = digest_of("FROM", "image", oci_image.file_sha256(archive))
            if not self.has(key):
                with self.making(key) as staging:
                    info = oci_image.unpack_image(archive, staging / "_")
                    meta = {"env": info.env, "workdir": info.workdir,
                            "entrypoint": info.entrypoint or [], "cmd": info.cmd or []}
                    (staging / "image.json").write_text(json.dumps(meta))
        meta = json.loads((self.root / key / "image.json").read_text())
        argv = [*meta["entrypoint"], *meta["cmd"]]
        tmpl = Template(name=source, kind="oci", layers=[Layer("/", [])], env=meta["env"],
                        workdir=meta["workdir"] or "/", start_cmd=shlex.join(argv),
                        build_inputs={"recipe_layers": [key], "recipe_key": key},
                        description=f"from {source}")
        return replace(tmpl, layers=self.compose(tmpl, [key])), key

    # RUN ---------------------------------------------------------------------------------
    def capture(self, key: str, uppers: list[tuple[str, int]], mounts: list[str]) -> None:
        """A RUN's layer: each (target, descriptor of its upper dir) copied confined,
        without the engine's ``mounts`` (their empty mount points)."""
        budget = layer_diff.Budget(max_bytes=self.max_layer_bytes)
        layers = [Layer(target, []) for target, _ in uppers]
        with self.making(key) as staging:
            for target, upper in uppers:
                with os.scandir(upper) as it:
                    if next(it, None) is None:
                        continue  # nothing written under this target
                dst = staging / target_dirname(target)
                dst.mkdir(mode=0o755)
                out = os.open(dst, _DIR)
                budget.links, budget.root_fd = {}, out
                budget.skip = frozenset(
                    "/" + rel for layer, rel in (target_of(layers, m) for m in mounts)
                    if layer.target == target and rel)
                try:
                    layer_diff.copy_upper(upper, out, budget)
                    st = os.fstat(upper)
                    os.fchown(out, *layer_diff.sandbox_ids(st))
                    os.fchmod(out, stat.S_IMODE(st.st_mode))
                finally:
                    os.close(out)
                if not any(dst.iterdir()):
                    dst.rmdir()  # only the engine's mount points were there

    # the template ------------------------------------------------------------------------
    def save(self, tmpl: Template) -> Template:
        """The built template under its name (a recipe template of that name replaced:
        its sandboxes keep running on its layers, which stay until pruned)."""
        folder = self.store.path(tmpl.name)
        own = tmpl.build_inputs.get("recipe_own", [])
        tmpl.build_inputs["recipe_bytes"] = sum(self.size(k) for k in own)
        with open(self.store.root / ".import.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.store.exists(tmpl.name):
                old = self.store.get(tmpl.name)
                if old.kind != "recipe":
                    raise InvalidArgumentError(
                        f"template {tmpl.name!r} exists and was not built from a recipe "
                        f"({old.kind}); remove it first or choose another name")
                if old.build_inputs.get("owner", "") != tmpl.build_inputs.get("owner", ""):
                    raise InvalidArgumentError(f"template {tmpl.name!r} belongs to another "
                                               "tenant; choose another name")
            folder.mkdir(mode=0o755, exist_ok=True)
            self.store.save(tmpl)
        return tmpl

    # COPY / WORKDIR ----------------------------------------------------------------------
    def copy_in(self, key: str, layers: list[Layer], context: Path, sources: list[str],
                dest: str, owner: tuple[int, int] | None, mode: int | None = None) -> None:
        """COPY ``sources`` (relative to ``context``, never out of it) to ``dest`` as a
        new layer over ``layers``: a directory's content into ``dest``; a file as ``dest``,
        or into it when ``dest`` ends with ``/`` or several sources are given."""
        ctx = os.open(context, _DIR)
        try:
            matches = _expand(ctx, context, sources)
            into = dest.endswith("/") or len(matches) > 1
            budget = layer_diff.Budget(max_bytes=self.max_context_bytes, mode=mode,
                                       what="the COPY sources (the build context limit)")

            def ids(st: os.stat_result) -> tuple[int, int]:
                return owner or (0, 0)

            with self.making(key) as staging:
                for rel, st in matches:
                    if stat.S_ISDIR(st.st_mode):
                        dst = make_dirs(staging, layers, dest, last=True)
                        src = openat2(ctx, rel, _DIR, resolve=_CTX)
                        try:
                            layer_diff.copy_tree(src, dst, budget, ids, whiteouts=False)
                        finally:
                            os.close(src)
                            os.close(dst)
                        continue
                    where = f"{dest.rstrip('/')}/{os.path.basename(rel)}" if into else dest
                    dst = make_dirs(staging, layers, where, last=False)
                    parent = openat2(ctx, os.path.dirname(rel) or ".", _DIR, resolve=_CTX)
                    try:
                        layer_diff.copy_entry(parent, dst, os.path.basename(rel),
                                              os.path.basename(where), budget, ids,
                                              whiteouts=False)
                    finally:
                        os.close(parent)
                        os.close(dst)
        finally:
            os.close(ctx)

    def owner(self, layers: list[Layer], spec: str) -> tuple[int, int]:
        """``--chown=USER[:GROUP]`` as ids, from the template's own accounts."""
        return template_view.owner(layers, spec)

    def mkdir(self, key: str, layers: list[Layer], path: str) -> None:
        """WORKDIR: ``path`` made (root's, 0755) where the template lacks it."""
        with self.making(key) as staging:
            if lookup(layers, path) is None:
                os.close(make_dirs(staging, layers, path, last=True))

_CTX = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS  # links inside the context may stay in it


def _expand(ctx: int, context: Path, sources: list[str]) -> list[tuple[str, os.stat_result]]:
    """The context entries ``sources`` name (globs expanded), each checked to stay in the
    context: no absolute path, no ``..`` out, no symlink leading out."""
    out = []
    for source in sources:
        rel = os.path.normpath(source.lstrip("/")) if source not in ("", ".") else "."
        if rel == ".." or rel.startswith("../"):
            raise InvalidArgumentError(f"COPY {source}: the path is outside the build context "
                                       f"({context}); only files under it can be copied")
        names = sorted(glob.glob(rel, root_dir=context)) if glob.has_magic(rel) else [rel]
        if not names:
            raise InvalidArgumentError(f"COPY {source}: nothing in the build context matches")
        for name in names:
            try:
                fd = openat2(ctx, name, os.O_PATH | os.O_NOFOLLOW, resolve=_CTX)
            except UnsafePathError:
                raise InvalidArgumentError(f"COPY {source}: a symlink on the way leads out of "
                                           f"the build context ({context})") from None
            except FileNotFoundError:
                raise InvalidArgumentError(f"COPY {source}: no such file in the build context "
                                           f"({context})") from None
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            out.append((name, st))  # a symlink is copied as the link it is, never followed
    return out


def _du(top: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _authfile(where: Path, source: str, auth: tuple[str, str]) -> str:
    """A containers auth file (0600 from birth) holding ``auth`` for ``source``'s
    registry."""
    import base64

    registry = image_registry(source) or source
    user, password = auth
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path = where / "auth.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"auths": {registry: {"auth": token}}}, out)
    return str(path)


def _skopeo_error(stderr: str) -> str:
    """skopeo's reason, without its log framing (``time=... level=fatal msg="..."``)."""
    text = stderr.strip()
    found = re.search(r'msg="((?:[^"\\]|\\.)*)"', text)
    return (found.group(1).replace('\\"', '"') if found else text)[-500:]
