"""The embedded engine and a loopback gateway for a benchmark, started the same way by every
script that compares them (gateway.py, pty.py, watch.py, e2b_sdk.py) and by
scripts/e2b_suites.py.

Unless ``ABX_DATA_DIR`` is set, both use a fresh data dir, removed (with its sandboxes and
the engine's host mounts) afterwards, so a bench leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Setup:
    local: Any  # the embedded engine's Provider
    gateway: Any  # agent_sandbox.surfaces.gateway.process.GatewayProcess
    tokens: dict[str, str] = field(default_factory=dict)  # key name -> token

    def remote(self, key: str | None = None) -> Any:
        """A RemoteProvider to the gateway (as ``key``; none: the gateway is open)."""
        from agent_sandbox.remote import RemoteProvider

        return RemoteProvider(self.gateway.url, self.tokens[key] if key else None)


@contextmanager
def engine_and_gateway(keys: dict[str, dict[str, Any]] | None = None) -> Iterator[Setup]:
    """``keys``: name -> ``KeyStore.create`` options; without, the gateway has no keys
    (open on loopback)."""
    own_data = "ABX_DATA_DIR" not in os.environ
    os.environ.setdefault("ABX_DATA_DIR", tempfile.mkdtemp(prefix="abx-bench-", dir="/var/tmp"))
    os.environ.setdefault("ABX_POOL_SIZE", "0")
    from agent_sandbox.providers.local import local_provider
    from agent_sandbox.surfaces.gateway.process import GatewayProcess
    from agent_sandbox.surfaces.http.keys import KeyStore

    keys_file, tokens = None, {}
    if keys is not None:
        keys_file = str(Path(tempfile.mkdtemp(prefix="abx-bench-keys-")) / "keys.db")
        store = KeyStore(keys_file)
        tokens = {name: store.create(name, **options)[1] for name, options in keys.items()}
    gateway = GatewayProcess(keys_file=keys_file).start()
    local = local_provider()
    try:
        yield Setup(local, gateway, tokens)
    finally:
        gateway.stop()
        if own_data:  # leave no sandboxes, mounts or data dir behind
            from agent_sandbox.backends.runc import supervisor

            for info in local.list():
                local.kill(info.sandbox_id, delete_volume=True)
            supervisor.stop(Path(os.environ["ABX_DATA_DIR"]))
            local.close()
            local.backend.release_host_mounts()
            shutil.rmtree(os.environ["ABX_DATA_DIR"], ignore_errors=True)
            if keys_file:
                shutil.rmtree(Path(keys_file).parent, ignore_errors=True)
