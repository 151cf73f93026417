"""Retry-After is whole seconds whatever an error's details say: they may come from a
sandbox's guest, and a text there would be a header of its choosing."""

from __future__ import annotations

import pytest

from agent_sandbox.core.errors import LockedError, ResourceExhaustedError
from agent_sandbox.surfaces.http.errors import sandbox_error_response


@pytest.mark.parametrize("given, sent", [("1\r\nSet-Cookie: x=y", "1"), (-5, "1"),
                                         (True, "1"), (None, "1"), (30, "30"), (1e9, "3600")])
def test_retry_after_is_whole_seconds(given: object, sent: str) -> None:
    for cls in (ResourceExhaustedError, LockedError):
        response = sandbox_error_response(cls("busy", details={"retry_after": given}))
        assert response.headers["retry-after"] in (sent, str(min(int(sent), 60))), cls
