"""envd's Filesystem service (stub: filled in by the filesystem work)."""

from __future__ import annotations

from agent_sandbox.server.e2b.envd_pb.filesystem.filesystem_connect import (
    Filesystem,
    FilesystemASGIApplication,
)


class FilesystemService(Filesystem):
    pass


def application() -> FilesystemASGIApplication:
    return FilesystemASGIApplication(FilesystemService())
