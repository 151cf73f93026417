"""The sandbox gateway: a REST API over the engine, for remote clients (``abx serve``)."""

from agent_sandbox.server.app import create_app
from agent_sandbox.server.keys import ApiKey, KeyStore
from agent_sandbox.server.serve import serve

__all__ = ["ApiKey", "KeyStore", "create_app", "serve"]
