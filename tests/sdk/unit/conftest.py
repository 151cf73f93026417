"""Unit tests of the SDK's pure code: no sandbox, no gateway (overrides the parent's
local/remote parametrization, which would start a gateway for nothing)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def provider_kind() -> str:
    return "none"
