"""STDIO entry point: ``python -m agent_sandbox.surfaces.mcp``.

stdout carries JSON-RPC only; everything else goes to stderr. When the session ends (EOF
on stdin, SIGTERM or SIGINT) every non-persistent sandbox it created is destroyed.

Start-up order matters to the IDE waiting on it: the descriptors are claimed and the
first ``initialize`` answered (``early_stdio``) before the MCP SDK and the engine are
imported, so this module imports only the standard library at the top.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import anyio

    from agent_sandbox.surfaces.mcp.early_stdio import EarlyStdio
    from agent_sandbox.surfaces.mcp.server import AgentServer

log = logging.getLogger("agent_sandbox.surfaces.mcp")


async def _watch_signals(scope: anyio.CancelScope) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received signal %s: ending the session", signum)
            scope.cancel()
            return


async def serve(server: AgentServer, wire: EarlyStdio) -> None:
    import anyio

    from agent_sandbox.providers import local
    from agent_sandbox.surfaces.mcp.stdio import bounded_stdio

    runtime = server.runtime
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, tg.cancel_scope)
            async with bounded_stdio(wire) as (read_stream, write_stream):
                await server.run(read_stream, write_stream,
                                 server.create_initialization_options())
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            killed = await runtime.sessions.end_all()
            if killed:
                log.info("session ended: destroyed %d sandbox(es)", killed)
            await anyio.to_thread.run_sync(local.drain_running_pool)
        runtime.audit.close()


def main(argv: list[str] | None = None) -> int:
    from agent_sandbox.surfaces.mcp.early_stdio import STDIO_DEFAULT_VERSION, EarlyStdio

    wire = EarlyStdio()  # first: stdin is read and `initialize` answered from here on
    from agent_sandbox.config.settings import Settings, SettingsError

    try:
        settings = Settings()  # the one read of the environment in this process
    except SettingsError as exc:
        print(f"agent-sandbox MCP: {exc.message}", file=sys.stderr)
        wire.close()
        return 2
    logging.basicConfig(level=settings.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import anyio
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    from agent_sandbox.providers.select import use_settings
    from agent_sandbox.surfaces.mcp.banner import auth_configured, print_banner
    from agent_sandbox.surfaces.mcp.config import AgentConfig, with_warm_pool
    from agent_sandbox.surfaces.mcp.server import create_mcp_app

    config = AgentConfig.from_settings(settings)
    # The sandboxes the tools create (through the SDK) come from an engine made with these.
    use_settings(with_warm_pool(settings, config.template))
    try:
        server = create_mcp_app(config=config, transport="stdio")
    except Exception as exc:  # noqa: BLE001 - e.g. a bad ABX_MCP_TOOLS
        print(f"agent-sandbox MCP: {exc}", file=sys.stderr)
        wire.close()
        return 2
    print_banner(
        transport="stdio",
        protocol=f"{', '.join(HANDSHAKE_PROTOCOL_VERSIONS)} (initialize; missing or unsupported "
                 f"-> {STDIO_DEFAULT_VERSION}), {', '.join(MODERN_PROTOCOL_VERSIONS)} (discover)",
        template=config.template,
        tools=server.runtime.tools,
        auth="none on stdio (the client owns the process); ABX_MCP_AUTH_TOKEN "
             + ("is set" if auth_configured(settings) else "not set"),
        stop="close stdin (EOF), or SIGTERM / Ctrl-C",
    )
    anyio.run(serve, server, wire)
    return 0


if __name__ == "__main__":
    sys.exit(main())
