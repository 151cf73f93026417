"""Unpacks container image archives into a template rootfs, trusting nothing in them.

Two archive formats: an OCI image layout tarball (``skopeo copy ... oci-archive:x.tar``)
and a ``docker save`` tarball (``manifest.json``). This module picks the image (tag,
platform) and reads its config; ``oci_archive`` reads the archive, checking every blob
against its digest before use; ``oci_layers`` applies the layers in order with their
whiteouts, refusing members that would write outside the rootfs and following symlinks
only as if the rootfs were ``/`` (never onto the host).
"""

from __future__ import annotations

import platform
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc.oci.archive import (
    DIGEST_RE,
    ImageArchive,
    LayerRef,
    blob_name,
    hash_stream,
    unpack_layer,
    verify_layer,
)
from agent_sandbox.backends.runc.oci.layers import apply_layer, member_path, resolve_in_root
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.validate import is_env_name

__all__ = ["ImageInfo", "ProgressFn", "apply_layer", "file_sha256", "host_arch", "member_path",
           "resolve_in_root", "unpack_image"]

ProgressFn = Callable[[int, int, str], None]

_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
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


def host_arch() -> str:
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


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


def _oci_manifest(arc: ImageArchive, ref: str | None) -> tuple[dict[str, Any], str]:
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
                nested = arc.read_json(blob_name(desc["digest"]), desc["digest"])
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
    return arc.read_json(blob_name(digest), digest), digest


def _oci_image(arc: ImageArchive, ref: str | None) -> tuple[dict[str, Any], list[LayerRef],
                                                         str, str | None]:
    manifest, manifest_digest = _oci_manifest(arc, ref)
    config_digest = manifest["config"]["digest"]
    config = arc.read_json(blob_name(config_digest), config_digest)
    layers = [LayerRef(blob_name(d["digest"]), d["digest"], None, int(d.get("size", 0)))
              for d in manifest.get("layers") or []]
    return config, layers, config_digest, manifest_digest


def _docker_image(arc: ImageArchive, ref: str | None) -> tuple[dict[str, Any], list[LayerRef],
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
    config = arc.read_json(config_name, config_digest if DIGEST_RE.match(config_digest)
                           else None)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    names = [member_path(n) for n in entry.get("Layers") or []]
    if len(diff_ids) != len(names):
        raise InvalidArgumentError("docker archive: layer count does not match the config's "
                                   "diff_ids")
    layers = [LayerRef(n, None, d, arc.size(n)) for n, d in zip(names, diff_ids, strict=True)]
    return config, layers, config_digest, None


# ---- the whole image -------------------------------------------------------------------
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
    arc = ImageArchive(archive)
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
            verify_layer(arc, layer)
            unpack_layer(arc, layer, dest)
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
        return hash_stream(fh, "sha256")
