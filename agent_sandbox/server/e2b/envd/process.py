"""envd's Process service (stub: filled in by the process work)."""

from __future__ import annotations

from agent_sandbox.server.e2b.envd_pb.process.process_connect import (
    Process,
    ProcessASGIApplication,
)


class ProcessService(Process):
    pass


def application() -> ProcessASGIApplication:
    return ProcessASGIApplication(ProcessService())
