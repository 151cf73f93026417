"""A one-layer docker-archive image tar (what ``docker save`` writes and ``docker load``,
``ctr images import`` and ``skopeo copy docker-archive:`` read), written as a stream.

The layer is streamed straight into the archive: its member header is written first with
size 0 and patched once the layer is complete, so a layer of GBs is never held in memory
nor written twice. The image reference may depend on the layer's digest (it goes into
``manifest.json``, written last). Standard library only: scripts/k8s/mkimage.py loads this
file by path with the system python3.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

BLOCK = 512
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAYER_NAME = "layer.tar"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64"}


def host_architecture() -> str:
    machine = platform.machine()
    return _ARCH.get(machine, machine)


class _Counting:
    """A write-only file that hashes and counts what goes through to ``out``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)


@dataclass(frozen=True)
class ArchiveInfo:
    ref: str
    path: str
    size: int  # bytes of the archive
    layer_size: int  # bytes of the uncompressed layer
    diff_id: str  # sha256:<hex> of the layer
    config_digest: str  # sha256:<hex> of the config: the image id


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info.tobuf(format=tarfile.GNU_FORMAT) + data + _pad(len(data))


def _pad(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def write_archive(path: str, fill: Callable[[tarfile.TarFile], None],
                  ref: Callable[[str], str] | str, config: dict[str, Any]) -> ArchiveInfo:
    """Write the archive at ``path`` (via ``path.tmp``, renamed at the end).

    ``fill(tar)`` adds the layer's members to an open stream-mode ``TarFile``. ``ref`` is the
    image reference, or a function of the layer's diff id giving it. ``config``: the image
    config's ``config`` part (Cmd, Env, WorkingDir, Labels...)."""
    config = dict(config)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w+b") as out:
            out.write(b"\0" * BLOCK)  # the layer's header, written once its size is known
            counting = _Counting(out)
            with tarfile.open(fileobj=counting, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                fill(tar)
            layer_size = counting.size
            out.write(_pad(layer_size))
            diff_id = "sha256:" + counting.sha.hexdigest()
            header = tarfile.TarInfo(_LAYER_NAME)
            header.size = layer_size
            header.mode = 0o644
            raw = header.tobuf(format=tarfile.GNU_FORMAT)  # base-256 size past 8 GiB
            assert len(raw) == BLOCK
            end = out.tell()
            out.seek(0)
            out.write(raw)
            out.seek(end)
            name = ref(diff_id) if callable(ref) else ref
            image_config = {
                "architecture": host_architecture(), "os": "linux",
                "created": config.pop("created", "1970-01-01T00:00:00Z"),
                "config": config,
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created_by": "agent-sandbox"}],
            }
            cfg = json.dumps(image_config, sort_keys=True).encode()
            cfg_hex = hashlib.sha256(cfg).hexdigest()
            manifest = json.dumps([{"Config": f"{cfg_hex}.json", "RepoTags": [name],
                                    "Layers": [_LAYER_NAME]}]).encode()
            out.write(_member(f"{cfg_hex}.json", cfg))
            out.write(_member("manifest.json", manifest))
            out.write(b"\0" * (2 * BLOCK))
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return ArchiveInfo(ref=name, path=path, size=size, layer_size=layer_size,
                       diff_id=diff_id, config_digest="sha256:" + cfg_hex)


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644,
              mtime: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, mtime
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755, mtime: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, mtime
    tar.addfile(info)
