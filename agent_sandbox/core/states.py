"""A sandbox's states: what a record holds, and what callers may see."""

from __future__ import annotations

from enum import StrEnum


class SandboxState(StrEnum):
    """A sandbox row's state; the values are what the database (and JSON) hold.

    Callers see RUNNING and PAUSED. POOLED is a warm sandbox nobody has claimed. The
    others are work in progress that a crash leaves for recover() to finish: a create,
    or a kill keeping / deleting the volume."""

    RUNNING = "running"
    PAUSED = "paused"
    POOLED = "pooled"
    CREATING = "creating"
    KILLING = "killing"
    KILLING_VOLUME = "killing-volume"


VISIBLE = (SandboxState.RUNNING, SandboxState.PAUSED)
