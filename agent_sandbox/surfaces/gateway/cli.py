"""``python -m agent_sandbox.surfaces.gateway``: serve, and keys create / list / revoke.

The functions ``keys_create``, ``keys_list``, ``keys_revoke`` and ``serve`` are what the
``abx`` CLI wraps for ``abx keys ...`` and ``abx serve``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.providers.choice import DAEMON_GROUP
from agent_sandbox.surfaces.gateway.serve import serve, with_network_ceiling
from agent_sandbox.surfaces.http.keys import KeyStore


def keys_create(name: str, *, admin: bool = False, max_sandboxes: int | None = None,
                max_commands: int | None = None, network: str | None = None,
                e2b: bool = False, api_keys_file: str | Path | None = None,
                settings: Settings | None = None) -> dict[str, object]:
    """A new key: its public fields plus ``token`` (shown this once, never stored).
    ``network``: the key's network ceiling (None: the gateway's)."""
    store = KeyStore(api_keys_file, settings=settings)
    key, token = store.create(name, admin=admin, max_sandboxes=max_sandboxes,
                              max_commands=max_commands, network_ceiling=network,
                              e2b=e2b)
    return {**key.public(), "token": token}


def keys_list(api_keys_file: str | Path | None = None,
              settings: Settings | None = None) -> list[dict[str, object]]:
    return [k.public() for k in KeyStore(api_keys_file, settings=settings).list()]


def keys_revoke(key_id_or_name: str, api_keys_file: str | Path | None = None,
                settings: Settings | None = None) -> dict[str, object]:
    return KeyStore(api_keys_file, settings=settings).revoke(key_id_or_name).public()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent_sandbox.surfaces.gateway",
                                     description="the agent-sandbox REST gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run the gateway")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8080)
    run.add_argument("--api-keys-file", default=None,
                     help="key database (default: $ABX_GATEWAY_KEYS_FILE, else "
                          "$ABX_DATA_DIR/gateway-keys.db)")
    run.add_argument("--unix", default=None, metavar="PATH",
                     help="be the shared daemon on this unix socket instead of TCP "
                          "(peer credentials, no keys)")
    run.add_argument("--group", default=DAEMON_GROUP,
                     help=f"the unix socket's group (default {DAEMON_GROUP})")
    run.add_argument("--log-level", default="warning")
    run.add_argument("--network-ceiling", default=None, metavar="POLICY",
                     help="the most network any sandbox may have (default: "
                          "$ABX_GATEWAY_NETWORK_CEILING, else full)")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(dest="action",
                                                                        required=True)
    create = keys.add_parser("create")
    create.add_argument("--name", required=True)
    create.add_argument("--admin", action="store_true")
    create.add_argument("--max-sandboxes", type=int)
    create.add_argument("--max-commands", type=int)
    create.add_argument("--network", default=None, metavar="POLICY",
                        help="the key's network ceiling (default: the gateway's)")
    keys.add_parser("list")
    revoke = keys.add_parser("revoke")
    revoke.add_argument("key", help="key id or name")
    for p in (create, revoke, keys.choices["list"]):
        p.add_argument("--api-keys-file", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings()  # the one read of the environment in this process
        if args.command == "serve":
            settings = with_network_ceiling(settings, args.network_ceiling)
            serve(args.host, args.port, args.api_keys_file, args.log_level, unix=args.unix,
                  group=args.group, settings=settings)
        elif args.action == "create":
            out = keys_create(args.name, admin=args.admin, max_sandboxes=args.max_sandboxes,
                              max_commands=args.max_commands, network=args.network,
                              api_keys_file=args.api_keys_file,
                              settings=settings)
            print(json.dumps(out, indent=2))
        elif args.action == "list":
            print(json.dumps(keys_list(args.api_keys_file, settings), indent=2))
        else:
            print(json.dumps(keys_revoke(args.key, args.api_keys_file, settings), indent=2))
    except SandboxError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    return 0
