"""``Volume``: the /workspace volumes sandboxes leave behind.

Every sandbox gets a volume as its /workspace; ``Sandbox.kill()`` keeps it (so a new
sandbox can attach it: ``Sandbox.create(volume=...)``) unless told
``kill(delete_volume=True)``. These list, inspect and delete the kept ones. Through a
gateway a key sees (and deletes) only the volumes of its own sandboxes.
"""

from __future__ import annotations

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.models import VolumeInfo
from agent_sandbox.providers import Provider, default_provider


def _volume_id(value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or len(value) > 128:
        raise InvalidArgumentError(f"invalid volume id {value!r}: ids look like 'vol-' and "
                                   "10 letters or digits (see Volume.list())")
    return value


class Volume:
    """Volumes, by id (``vol-...``); the methods are classmethods."""

    def __init__(self) -> None:
        raise TypeError("Volume has only classmethods: Volume.list(), Volume.inspect(id), "
                        "Volume.delete(id)")

    @classmethod
    def list(cls, provider: Provider | None = None) -> list[VolumeInfo]:
        """Every volume you may see, attached (``attached_to`` a sandbox) or kept."""
        return (provider or default_provider()).list_volumes()

    @classmethod
    def inspect(cls, volume_id: str, provider: Provider | None = None) -> VolumeInfo:
        """One volume; ``NotFoundError`` if there is none of yours by that id."""
        volume_id = _volume_id(volume_id)
        for volume in (provider or default_provider()).list_volumes():
            if volume.volume_id == volume_id:
                return volume
        raise NotFoundError(f"volume {volume_id!r} not found")

    @classmethod
    def delete(cls, volume_id: str, provider: Provider | None = None) -> None:
        """Delete a kept volume and its files (one attached to a live sandbox is refused:
        kill that sandbox first)."""
        (provider or default_provider()).delete_volume(_volume_id(volume_id))
