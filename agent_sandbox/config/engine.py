"""Where the engine keeps its state, and the defaults every sandbox gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_sandbox.config.settings import Settings

# Container root maps to this unprivileged host id (and the 65536 ids after it).
HOST_ID_BASE = 100000
HOST_ID_COUNT = 65536


def default_data_dir(settings: Settings | None = None) -> Path:
    """The engine's state directory (ABX_DATA_DIR, else its default)."""
    return (settings or Settings()).data_dir


def _from_settings(name: str) -> Any:
    # EngineConfig() without arguments: the environment, read when it is built.
    return field(default_factory=lambda: getattr(Settings(), name))


@dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits; ``None`` in a create call means "the default"."""

    memory_mb: int = 1024
    cpu: float = 1.0
    pids: int = 512
    # Allocated on the host while mounted (a real reservation, never overcommitted).
    disk_mb: int = 1024


@dataclass(frozen=True)
class EngineConfig:
    data_dir: Path = _from_settings("data_dir")
    limits: Limits = Limits()
    # Bytes of each output stream kept per command (the tail); the rest is flagged.
    max_output: int = 1 << 20
    command_timeout: float = 60.0
    # Keep at least this much of the host filesystem free (refuse to grow past it).
    host_reserve_mb: int = 2048
    reaper_interval: float = 2.0
    # A frozen sandbox still holds its memory; after this long paused its container is
    # stopped (disk kept). Resuming then boots it afresh: files stay, processes do not.
    paused_stop_after: float = _from_settings("paused_stop_after")
    # A paused sandbox unused this long is ended (0: never): the operator's end of life.
    paused_max_age: float = _from_settings("paused_max_age")
    # Warm pool: started, unclaimed sandboxes per pooled template, so a create that fits
    # (default limits, no network, no volume) returns in milliseconds. Long-lived servers
    # turn it on; a one-off script should not leave warm sandboxes behind.
    pool_size: int = _from_settings("pool_size")
    pool_templates: tuple[str, ...] = _from_settings("pool_templates")
    # Templates root builds once for every user (code-interpreter-v1), and where from.
    shared_templates_dir: Path = _from_settings("shared_templates_dir")
    template_index_url: str = _from_settings("template_index_url")
    # What sandboxes may reach beyond the policy's always-blocked ranges, and names the
    # policy resolver answers itself (runtime/netproc.proxy_config checks both).
    network_open_ranges: tuple[str, ...] = _from_settings("network_open_ranges")
    # Recipe builds: what RUN steps may reach, and how much a layer may hold.
    build_network: str = _from_settings("build_network")
    build_max_layer_mb: int = _from_settings("build_max_layer_mb")
    network_hosts: tuple[str, ...] = _from_settings("network_hosts")
    secrets_upstream_ca: str = _from_settings("secrets_upstream_ca")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> EngineConfig:
        """The engine's part of ``settings`` (``overrides``: other fields, e.g. limits)."""
        return cls(**{"data_dir": settings.data_dir,
                      "paused_stop_after": settings.paused_stop_after,
                      "paused_max_age": settings.paused_max_age,
                      "pool_size": settings.pool_size,
                      "pool_templates": settings.pool_templates,
                      "shared_templates_dir": settings.shared_templates_dir,
                      "template_index_url": settings.template_index_url,
                      "network_open_ranges": settings.network_open_ranges,
                      "build_network": settings.build_network,
                      "build_max_layer_mb": settings.build_max_layer_mb,
                      "network_hosts": settings.network_hosts,
                      "secrets_upstream_ca": settings.secrets_upstream_ca, **overrides})

    @property
    def audit_log(self) -> Path:
        """What the service decided on its own (a sandbox ended by its end of life)."""
        return self.data_dir / "audit.log"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "state.db"

    @property
    def templates_dir(self) -> Path:
        return self.data_dir / "templates"

    @property
    def sandboxes_dir(self) -> Path:
        return self.data_dir / "sandboxes"

    @property
    def idmap_dir(self) -> Path:
        return self.data_dir / "idmap"

    @property
    def runc_root(self) -> Path:
        return self.data_dir / "runc"
