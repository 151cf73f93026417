"""A real gateway (``abx serve`` as a subprocess) with its own key store, for the tests
that talk to one (tests/server, tests/e2b)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.http.keys import KeyStore


@contextmanager
def running_gateway(prefix: str, keys: dict[str, dict[str, Any]],
                    env: dict[str, str] | None = None
                    ) -> Iterator[tuple[GatewayProcess, KeyStore, dict[str, str]]]:
    """The gateway (with ``env`` added to its environment), its key store, and a token per
    key of ``keys`` (name: create's options), made before it starts; stopped afterwards."""
    keys_file = Path(tempfile.mkdtemp(prefix=prefix)) / "keys.db"
    store = KeyStore(keys_file)
    tokens = {name: store.create(name, **options)[1] for name, options in keys.items()}
    proc = GatewayProcess(keys_file=str(keys_file), extra_env=env)
    proc.start()
    try:
        yield proc, store, tokens
    finally:
        proc.stop()
