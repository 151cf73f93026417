"""E2B's control plane through the real e2b SDK: create, info, list, timeout, pause and
connect, kill; and tenancy: key B can neither see nor touch key A's sandbox."""

from __future__ import annotations

import pytest
from conftest import E2BGateway

pytestmark = pytest.mark.integration


def test_create_list_timeout_kill(e2b_env: E2BGateway) -> None:
    from e2b import Sandbox

    sb = Sandbox.create(metadata={"purpose": "e2b-test"}, timeout=120)
    try:
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id and info.metadata == {"purpose": "e2b-test"}
        assert info.template_id == "base"
        listed = Sandbox.list(query=None).next_items()
        assert sb.sandbox_id in [s.sandbox_id for s in listed]
        sb.set_timeout(300)
        assert sb.is_running()
    finally:
        assert sb.kill() in (True, None)
    assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
