"""Unpacks container image archives into a template rootfs, trusting nothing in them.

Two archive formats: an OCI image layout tarball (``skopeo copy ... oci-archive:x.tar``)
and a ``docker save`` tarball (``manifest.json``). Every blob is checked against its
digest before use; layers are applied in order with their whiteouts; members that would
write outside the rootfs are refused, and symlinks are only ever followed as if the
rootfs were ``/`` (never onto the host).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import posixpath
import re
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.runtime.validate import is_env_name

ProgressFn = Callable[[int, int, str], None]

_CHUNK = 1 << 20
_MAX_JSON = 8 << 20
_MAX_LINK_HOPS = 40
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_DIGEST_RE = re.compile(r"^(sha256|sha512):([a-f0-9]{64}|[a-f0-9]{128})\Z")
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386",
           "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


@dataclass
class ImageInfo:
    """What a template keeps from an image: its config and where it came from."""

    format: str  # "oci" | "docker-archive"
    env: dict[str, str]
    workdir: str
    cmd: list[str] | None
    entrypoint: list[str] | None
    architecture: str
    config_digest: str
    manifest_digest: str | None
    layers: int


@dataclass
class _LayerRef:
    blob: str  # member name inside the archive
    digest: str | None  # of the blob as stored (OCI)
    diff_id: str | None  # of the uncompressed tar (docker-archive)
    size: int


def host_arch() -> str:
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


# ---- paths inside the rootfs -----------------------------------------------------------
def resolve_in_root(root: Path, rel: str, *, follow_last: bool = True) -> Path:
    """``rel`` resolved as if ``root`` were ``/``: symlinks, absolute or full of ``..``,
    are followed but can never lead out of ``root``. The result has no symlink in it
    (except, with ``follow_last=False``, its last component)."""
    todo = [p for p in rel.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = root.joinpath(*done, part)
        if (todo or follow_last) and candidate.is_symlink():
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise InvalidArgumentError(f"too many levels of symlinks resolving {rel!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            continue
        done.append(part)
    return root.joinpath(*done)


def member_path(name: str) -> str:
    """A tar member name as a clean relative path ("" for the root); hostile ones refused."""
    if name.startswith("/"):
        raise InvalidArgumentError(f"refusing archive member with an absolute path: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgumentError(f"refusing archive member with '..' in its path: {name!r}")
    return "/".join(parts)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


# ---- one layer -------------------------------------------------------------------------
def apply_layer(layer: tarfile.TarFile, root: Path) -> None:
    """Apply one layer on ``root``: its whiteouts first (they only ever hide what lower
    layers made), then its content, in archive order."""
    members = [(m, member_path(m.name)) for m in layer.getmembers()]
    for _, rel in members:
        if posixpath.basename(rel).startswith(_WHITEOUT):
            _apply_whiteout(root, rel)
    dirs: list[tuple[tarfile.TarInfo, Path]] = []
    for member, rel in members:
        if posixpath.basename(rel).startswith(_WHITEOUT):
            continue
        target = _extract(layer, member, rel, root)
        if target is not None and member.isdir():
            dirs.append((member, target))
    # Directory times last: creating their children changed them.
    for member, target in reversed(dirs):
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)


def _apply_whiteout(root: Path, rel: str) -> None:
    parent = resolve_in_root(root, posixpath.dirname(rel))
    name = posixpath.basename(rel)
    if name == _OPAQUE:
        if parent.is_dir():
            for child in parent.iterdir():
                _remove(child)
    elif not name.startswith(_WHITEOUT * 2):  # .wh..wh.* other than opq: aufs bookkeeping
        hidden = name[len(_WHITEOUT):]
        if hidden not in ("", ".", ".."):
            _remove(parent / hidden)


def _extract(layer: tarfile.TarFile, member: tarfile.TarInfo, rel: str,
             root: Path) -> Path | None:
    if rel == "":
        if member.isdir():
            _set_meta(root, member)
            return root
        raise InvalidArgumentError(f"refusing archive member {member.name!r}: the root "
                                   "must be a directory")
    if (member.ischr() or member.isblk()) and not (
            member.ischr() and member.devmajor == 0 and member.devminor == 0):
        return None  # real device nodes are never needed in a rootfs (/dev is a tmpfs)
    parent = resolve_in_root(root, posixpath.dirname(rel))
    parent.mkdir(parents=True, exist_ok=True)  # no symlink left in it: safe
    target = parent / posixpath.basename(rel)
    if member.isdir():
        if not (target.is_dir() and not target.is_symlink()):
            _remove(target)
            target.mkdir()
        _set_meta(target, member)
        return target
    _remove(target)
    if member.isreg():
        _write_file(layer, member, target)
    elif member.issym():
        os.symlink(member.linkname, target)  # only ever read inside the sandbox
    elif member.islnk():
        _hardlink(root, member, target)
        return target  # shares its source's metadata
    elif member.isfifo():
        os.mkfifo(target)
    elif member.ischr():
        os.mknod(target, stat.S_IFCHR, os.makedev(0, 0))  # an overlay whiteout: inert
    else:
        return None
    _set_meta(target, member)
    return target


def _write_file(layer: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    src = layer.extractfile(member)
    if src is None:
        raise InvalidArgumentError(f"archive member {member.name!r} has no data")
    with src, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
        shutil.copyfileobj(src, out, _CHUNK)


def _hardlink(root: Path, member: tarfile.TarInfo, target: Path) -> None:
    source = resolve_in_root(root, member_path(member.linkname), follow_last=False)
    if not os.path.lexists(source) or (source.is_dir() and not source.is_symlink()):
        raise InvalidArgumentError(f"refusing hard link {member.name!r}: its target "
                                   f"{member.linkname!r} is not a file in the image")
    os.link(source, target, follow_symlinks=False)


def _set_meta(path: Path, member: tarfile.TarInfo) -> None:
    if _AS_ROOT:  # a plain user's import is all its own (root inside its sandboxes)
        os.chown(path, member.uid, member.gid, follow_symlinks=False)
    if not member.issym():
        os.chmod(path, member.mode & 0o7777)  # after chown, which clears setuid bits
    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


_AS_ROOT = os.geteuid() == 0


# ---- the outer archive -----------------------------------------------------------------
class _Archive:
    """Random access to the members of an image archive, by normalised name."""

    def __init__(self, path: Path) -> None:
        try:
            self._tar = tarfile.open(path, "r:*")  # noqa: SIM115 - closed in close()
        except (tarfile.TarError, OSError) as exc:
            raise InvalidArgumentError(f"{path} is not a readable tar archive: {exc}") from exc
        self._members = {member_path(m.name): m for m in self._tar.getmembers()}

    def close(self) -> None:
        self._tar.close()

    def has(self, name: str) -> bool:
        return name in self._members

    def _member(self, name: str) -> tarfile.TarInfo:
        for _ in range(_MAX_LINK_HOPS):  # old docker-save reuses layers through symlinks
            member = self._members.get(name)
            if member is None:
                raise InvalidArgumentError(f"image archive has no {name!r}")
            if not member.issym():
                if not member.isreg():
                    raise InvalidArgumentError(f"image archive member {name!r} is not a file")
                return member
            name = member_path(posixpath.normpath(
                posixpath.join(posixpath.dirname(name), member.linkname)))
        raise InvalidArgumentError(f"too many symlinks in image archive at {name!r}")

    def size(self, name: str) -> int:
        return self._member(name).size

    def open(self, name: str) -> IO[bytes]:
        stream = self._tar.extractfile(self._member(name))
        assert stream is not None  # regular file, checked above
        return stream

    def read_json(self, name: str, digest: str | None = None) -> Any:
        member = self._member(name)
        if member.size > _MAX_JSON:
            raise InvalidArgumentError(f"image archive member {name!r} is too large")
        with self.open(name) as fh:
            data = fh.read()
        if digest is not None:
            _check_digest(hashlib.new(_algo(digest), data).hexdigest(), digest, name)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InvalidArgumentError(f"image archive member {name!r} is not JSON") from exc


def _algo(digest: str) -> str:
    match = _DIGEST_RE.match(digest) if isinstance(digest, str) else None
    if match is None:
        raise InvalidArgumentError(f"unsupported or malformed digest {digest!r}")
    return match.group(1)


def _check_digest(actual_hex: str, expected: str, what: str) -> None:
    if f"{_algo(expected)}:{actual_hex}" != expected:
        raise InvalidArgumentError(f"digest mismatch for {what}: expected {expected}, "
                                   f"got {_algo(expected)}:{actual_hex} (corrupt archive?)")


def _hash_stream(stream: IO[bytes], algo: str) -> str:
    h = hashlib.new(algo)
    while chunk := stream.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _blob(digest: str) -> str:
    algo = _algo(digest)
    return f"blobs/{algo}/{digest.split(':', 1)[1]}"


# ---- choosing the image ----------------------------------------------------------------
def _ref_names(desc: dict[str, Any]) -> set[str]:
    notes = desc.get("annotations") or {}
    return {v for k, v in notes.items()
            if k in ("org.opencontainers.image.ref.name", "io.containerd.image.name")}


def _platform_ok(desc: dict[str, Any]) -> bool:
    plat = desc.get("platform")
    if not plat:
        return True
    return plat.get("os", "linux") == "linux" and plat.get("architecture") == host_arch()


def _oci_manifest(arc: _Archive, ref: str | None) -> tuple[dict[str, Any], str]:
    descs = list(arc.read_json("index.json").get("manifests") or [])
    if ref is not None:
        descs = [d for d in descs if ref in _ref_names(d) or
                 any(n.endswith(":" + ref) for n in _ref_names(d))]
        if not descs:
            raise InvalidArgumentError(f"image archive has no image tagged {ref!r}")
    for _ in range(4):  # nested indexes (multi-arch images, docker 25+ save)
        flat: list[dict[str, Any]] = []
        for desc in descs:
            if desc.get("mediaType") in _INDEX_TYPES:
                nested = arc.read_json(_blob(desc["digest"]), desc["digest"])
                flat.extend(nested.get("manifests") or [])
            else:
                flat.append(desc)
        descs = flat
    wanted = [d for d in descs if _platform_ok(d) and d.get("mediaType") not in _INDEX_TYPES]
    if not wanted:
        found = sorted({str((d.get("platform") or {}).get("architecture")) for d in descs})
        raise InvalidArgumentError(f"image archive has no linux/{host_arch()} image "
                                   f"(found: {', '.join(found) or 'none'})")
    digest = wanted[0]["digest"]
    return arc.read_json(_blob(digest), digest), digest


def _oci_image(arc: _Archive, ref: str | None) -> tuple[dict[str, Any], list[_LayerRef],
                                                         str, str | None]:
    manifest, manifest_digest = _oci_manifest(arc, ref)
    config_digest = manifest["config"]["digest"]
    config = arc.read_json(_blob(config_digest), config_digest)
    layers = [_LayerRef(_blob(d["digest"]), d["digest"], None, int(d.get("size", 0)))
              for d in manifest.get("layers") or []]
    return config, layers, config_digest, manifest_digest


def _docker_image(arc: _Archive, ref: str | None) -> tuple[dict[str, Any], list[_LayerRef],
                                                            str, str | None]:
    entries = arc.read_json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise InvalidArgumentError("manifest.json of the docker archive lists no image")
    if ref is not None:
        entries = [e for e in entries if any(t == ref or t.endswith(":" + ref)
                                             for t in e.get("RepoTags") or [])]
        if not entries:
            raise InvalidArgumentError(f"docker archive has no image tagged {ref!r}")
    entry = entries[0]
    config_name = member_path(entry["Config"])
    # The config is named after its own digest: "<hex>.json" or "blobs/sha256/<hex>".
    hex_name = posixpath.basename(config_name).removesuffix(".json")
    config_digest = f"sha256:{hex_name}"
    config = arc.read_json(config_name, config_digest if _DIGEST_RE.match(config_digest)
                           else None)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    names = [member_path(n) for n in entry.get("Layers") or []]
    if len(diff_ids) != len(names):
        raise InvalidArgumentError("docker archive: layer count does not match the config's "
                                   "diff_ids")
    layers = [_LayerRef(n, None, d, arc.size(n)) for n, d in zip(names, diff_ids, strict=True)]
    return config, layers, config_digest, None


# ---- the whole image -------------------------------------------------------------------
def _verify_layer(arc: _Archive, layer: _LayerRef) -> None:
    if layer.digest is not None:
        with arc.open(layer.blob) as fh:
            _check_digest(_hash_stream(fh, _algo(layer.digest)), layer.digest, layer.blob)
    if layer.diff_id is not None:
        with arc.open(layer.blob) as fh:
            head = fh.read(2)
            fh.seek(0)
            stream: IO[bytes] = gzip.GzipFile(fileobj=fh) if head == _GZIP_MAGIC else fh
            _check_digest(_hash_stream(stream, _algo(layer.diff_id)), layer.diff_id,
                          layer.blob)


def _unpack_layer(arc: _Archive, layer: _LayerRef, root: Path) -> None:
    with arc.open(layer.blob) as fh:
        if fh.read(4) == _ZSTD_MAGIC:
            raise InvalidArgumentError(
                "zstd-compressed layers are not supported; re-save the image with gzip "
                "(skopeo copy --dest-compress-format gzip ...)")
        fh.seek(0)
        try:
            with tarfile.open(fileobj=fh, mode="r:*") as tf:
                apply_layer(tf, root)
        except tarfile.TarError as exc:
            raise InvalidArgumentError(f"layer {layer.blob} is not a valid tar: {exc}") from exc
        except (NotADirectoryError, FileExistsError, IsADirectoryError) as exc:
            # e.g. a member under a path an earlier member made a file
            raise InvalidArgumentError(f"layer {layer.blob} cannot be applied: {exc}") from exc


def _config_info(fmt: str, config: dict[str, Any], config_digest: str,
                 manifest_digest: str | None, layers: int) -> ImageInfo:
    cfg = config.get("config") or {}
    env: dict[str, str] = {}
    for item in cfg.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep and is_env_name(key) and "\x00" not in value:
            env[key] = value
    workdir = cfg.get("WorkingDir") or "/workspace"
    return ImageInfo(format=fmt, env=env, workdir=posixpath.normpath("/" + workdir.lstrip("/")),
                     cmd=cfg.get("Cmd"), entrypoint=cfg.get("Entrypoint"),
                     architecture=str(config.get("architecture", "")),
                     config_digest=config_digest, manifest_digest=manifest_digest,
                     layers=layers)


def unpack_image(archive: Path, dest: Path, *, ref: str | None = None,
                 progress: ProgressFn | None = None) -> ImageInfo:
    """Unpack the image in ``archive`` (OCI layout or docker-save tarball) into ``dest``
    (created here). ``ref`` picks a tag when the archive holds several images."""
    arc = _Archive(archive)
    try:
        if arc.has("index.json"):
            fmt, found = "oci", _oci_image(arc, ref)
        elif arc.has("manifest.json"):
            fmt, found = "docker-archive", _docker_image(arc, ref)
        else:
            raise InvalidArgumentError(f"{archive} is neither an OCI image layout (index.json) "
                                       "nor a docker-save archive (manifest.json)")
        config, layers, config_digest, manifest_digest = found
        total = sum(layer.size for layer in layers)
        done = 0
        if progress:
            progress(0, total, f"{len(layers)} layers to unpack")
        dest.mkdir(mode=0o755)
        for index, layer in enumerate(layers, 1):
            _verify_layer(arc, layer)
            _unpack_layer(arc, layer, dest)
            done += layer.size
            if progress:
                progress(done, total, f"layer {index}/{len(layers)} unpacked")
        return _config_info(fmt, config, config_digest, manifest_digest, len(layers))
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgumentError(f"malformed image archive {archive}: {exc!r}") from exc
    finally:
        arc.close()


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return _hash_stream(fh, "sha256")
