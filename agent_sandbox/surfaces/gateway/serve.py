"""Running the gateway under uvicorn, and the rule for binding beyond loopback."""

from __future__ import annotations

import sys
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.providers.choice import DAEMON_GROUP
from agent_sandbox.surfaces.gateway.tcp_listen import bind_tcp
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.loopback import is_loopback


def check_bind(host: str, keys: KeyStore) -> None:
    """Refuse to expose an open gateway: beyond loopback, at least one live key."""
    if not is_loopback(host) and keys.live_keys() == 0:
        raise InvalidArgumentError(
            f"refusing to listen on {host}: no API key exists, so anyone who can reach it "
            "could run commands. Create one first (abx keys create --name NAME) or listen "
            "on 127.0.0.1")


def with_network_ceiling(settings: Settings, ceiling: str | None) -> Settings:
    """``settings`` with the gateway's network ceiling from a command-line option (None:
    as the environment has it), checked like ABX_GATEWAY_NETWORK_CEILING."""
    if ceiling is None:
        return settings
    from agent_sandbox.core.network import parse

    try:
        parse(ceiling)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--network-ceiling: {exc.message}") from None
    return settings.model_copy(update={"gateway_network_ceiling": ceiling})


def serve(host: str = "127.0.0.1", port: int = 8080, api_keys_file: str | Path | None = None,
          log_level: str = "warning", *, unix: str | Path | None = None,
          group: str = DAEMON_GROUP, settings: Settings | None = None) -> None:
    """Run the gateway until interrupted (what ``abx serve`` calls).

    With ``unix`` it is the shared daemon instead: a unix socket of ``group``, local users
    identified by their peer credentials, no API keys (see ``unix.serve_unix``)."""
    import uvicorn

    settings = settings or Settings()
    if api_keys_file is not None:
        settings = settings.model_copy(update={"gateway_keys_file": Path(api_keys_file)})
    if unix is not None:
        from agent_sandbox.surfaces.gateway.unix import serve_unix

        serve_unix(unix, group=group, log_level=log_level, settings=settings)
        return

    from agent_sandbox.surfaces.gateway.app import create_app

    keys = KeyStore(settings=settings)
    check_bind(host, keys)
    sock = bind_tcp(host, port)  # a busy port fails here, before "serving on"
    try:
        config = uvicorn.Config(create_app(keys=keys, settings=settings),
                                log_level=log_level, timeout_keep_alive=30,
                                # Open streams (a command's output, a watch) would hold a
                                # stop until they end: they get 5 s, then are cut.
                                timeout_graceful_shutdown=5)
        print(f"abx gateway: serving on http://{host}:{port} (Ctrl-C stops it); "
              f"web console at http://{host}:{port}/ui/", file=sys.stderr)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
