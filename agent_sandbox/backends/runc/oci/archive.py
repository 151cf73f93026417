"""Reads an image archive (an OCI layout or ``docker save`` tarball): members by name,
JSON documents capped in size, every blob checked against its digest before use."""

from __future__ import annotations

import gzip
import hashlib
import json
import posixpath
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent_sandbox.backends.runc.oci.layers import (
    COPY_CHUNK,
    MAX_LINK_HOPS,
    apply_layer,
    member_path,
)
from agent_sandbox.core.errors import InvalidArgumentError

_MAX_JSON = 8 << 20
DIGEST_RE = re.compile(r"^(sha256|sha512):([a-f0-9]{64}|[a-f0-9]{128})\Z")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class LayerRef:
    blob: str  # member name inside the archive
    digest: str | None  # of the blob as stored (OCI)
    diff_id: str | None  # of the uncompressed tar (docker-archive)
    size: int


class ImageArchive:
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
        for _ in range(MAX_LINK_HOPS):  # old docker-save reuses layers through symlinks
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
            check_digest(hashlib.new(_algo(digest), data).hexdigest(), digest, name)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise InvalidArgumentError(f"image archive member {name!r} is not JSON") from exc


def _algo(digest: str) -> str:
    match = DIGEST_RE.match(digest) if isinstance(digest, str) else None
    if match is None:
        raise InvalidArgumentError(f"unsupported or malformed digest {digest!r}")
    return match.group(1)


def check_digest(actual_hex: str, expected: str, what: str) -> None:
    if f"{_algo(expected)}:{actual_hex}" != expected:
        raise InvalidArgumentError(f"digest mismatch for {what}: expected {expected}, "
                                   f"got {_algo(expected)}:{actual_hex} (corrupt archive?)")


def hash_stream(stream: IO[bytes], algo: str) -> str:
    h = hashlib.new(algo)
    while chunk := stream.read(COPY_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def blob_name(digest: str) -> str:
    algo = _algo(digest)
    return f"blobs/{algo}/{digest.split(':', 1)[1]}"


def verify_layer(arc: ImageArchive, layer: LayerRef) -> None:
    """The layer's blob against its digest (OCI) or its tar against its diff_id (docker)."""
    if layer.digest is not None:
        with arc.open(layer.blob) as fh:
            check_digest(hash_stream(fh, _algo(layer.digest)), layer.digest, layer.blob)
    if layer.diff_id is not None:
        with arc.open(layer.blob) as fh:
            head = fh.read(2)
            fh.seek(0)
            stream: IO[bytes] = gzip.GzipFile(fileobj=fh) if head == _GZIP_MAGIC else fh
            check_digest(hash_stream(stream, _algo(layer.diff_id)), layer.diff_id,
                         layer.blob)


def unpack_layer(arc: ImageArchive, layer: LayerRef, root: Path) -> None:
    """Apply the (verified) layer onto ``root``; an unreadable one is the archive's fault."""
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
