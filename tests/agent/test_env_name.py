"""The environment-variable-name rule: one host definition, and the guest's equal copy.

In-process; needs neither root nor an engine.
"""

from __future__ import annotations

import re

import pytest

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.guest import checks as guest_checks
from agent_sandbox.surfaces.rest import schemas


@pytest.fixture(scope="module", autouse=True)
def _code_template() -> None:
    """Overrides the package's: nothing here needs a template built."""


def test_the_guest_checks_the_same_pattern_as_the_host() -> None:
    # The guest is stdlib-only and cannot import the host's: its copy must stay equal.
    assert guest_checks.ENV_NAME_PATTERN == validate.ENV_NAME_PATTERN
    assert schemas.ENV_NAME_PATTERN == validate.ENV_NAME_PATTERN


@pytest.mark.parametrize("name", ["A", "_", "PATH", "a_b_1", "_9", "x" * 300])
def test_env_names_accepted(name: str) -> None:
    assert validate.is_env_name(name)
    assert re.fullmatch(guest_checks.ENV_NAME_PATTERN, name)


@pytest.mark.parametrize("name", ["", "1A", "A-B", "A=B", "A B", "A\x00", "FOO\n", "\nFOO",
                                  "é", "A.B", None, 5, b"A"])
def test_env_names_refused(name: object) -> None:
    assert not validate.is_env_name(name)
    with pytest.raises(InvalidArgumentError, match="environment variable name"):
        validate.envs({name: "v"})
    if isinstance(name, str):
        assert not re.fullmatch(guest_checks.ENV_NAME_PATTERN, name)
