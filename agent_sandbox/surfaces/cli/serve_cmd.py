"""``abx serve``: the REST gateway on TCP (API keys), or the shared daemon on a unix socket."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent_sandbox.providers.choice import DAEMON_GROUP
from agent_sandbox.surfaces.cli.settings import cli_settings


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (beyond loopback needs an "
                                      "API key to exist: `abx keys create`).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    api_keys_file: Annotated[Path | None, typer.Option(
        "--api-keys-file", help="The key database (default $ABX_GATEWAY_KEYS_FILE, else "
        "$ABX_DATA_DIR/gateway-keys.db).")] = None,
    unix: Annotated[str | None, typer.Option(
        "--unix", metavar="PATH", help="Be the shared daemon instead: listen on this unix "
        "socket (group --group, mode 0660); local users are identified by their peer "
        "credentials, no API keys. As a service: `abx daemon install`.")] = None,
    group: Annotated[str, typer.Option(help="Group allowed to use the unix socket (created "
                                       "if missing when run as root).")] = DAEMON_GROUP,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    network_ceiling: Annotated[str | None, typer.Option(
        "--network-ceiling", metavar="POLICY", help="The most network any sandbox may have "
        "(off, registries, a comma list of names/*.wildcards/CIDRs, full; default "
        "$ABX_GATEWAY_NETWORK_CEILING, else full). A key's own ceiling can only lower "
        "it.")] = None,
) -> None:
    """Run the sandbox gateway (REST API, OpenAPI at /openapi.json) until interrupted."""
    from agent_sandbox.surfaces.gateway.serve import serve as run
    from agent_sandbox.surfaces.gateway.serve import with_network_ceiling

    run(host, port, api_keys_file, log_level, unix=unix, group=group,
        settings=with_network_ceiling(cli_settings(), network_ceiling))
