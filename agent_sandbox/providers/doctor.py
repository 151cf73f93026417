"""The host checks of the engine this host runs (``abx doctor``): runc's."""

from __future__ import annotations

from agent_sandbox.backends.runc.doctor import host_checks

__all__ = ["host_checks"]
