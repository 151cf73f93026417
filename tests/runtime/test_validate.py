"""Input checks every engine entry point shares: a clear message naming what was wrong."""

from __future__ import annotations

import math

import pytest

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError


@pytest.mark.parametrize("value", ["sbx-ABCDEFGHIJ", "sbx-abc", "x" * 14, None, 5,
                                   "sbx-abcdefghij\n", "../sbx-abcdefghij"])
def test_sandbox_ids_are_exact(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid sandbox id"):
        validate.sandbox_id(value)


def test_paths_must_be_absolute_bounded_and_nul_free() -> None:
    assert validate.path("/workspace/a") == "/workspace/a"
    for bad, message in (("rel", "relative"), ("/a\0b", "NUL"), ("", "non-empty"),
                         ("/" + "a" * 5000, "4096"), (None, "non-empty")):
        with pytest.raises(InvalidArgumentError, match=message):
            validate.path(bad)


@pytest.mark.parametrize("value", [0, -1, math.nan, True, "3", 1e400])
def test_positive_numbers(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout"):
        validate.positive(value, "timeout", maximum=100)


def test_whole_numbers_and_bounds() -> None:
    assert validate.positive(2.0, "pid", integer=True) == 2
    with pytest.raises(InvalidArgumentError, match="whole number"):
        validate.positive(1.5, "pid", integer=True)
    with pytest.raises(InvalidArgumentError, match="at most 10"):
        validate.positive(11, "depth", maximum=10)


def test_env_names_and_values() -> None:
    assert validate.envs({"A_1": "x"}) == {"A_1": "x"}
    for bad in ({"1A": "x"}, {"A-B": "x"}, {"A": "x\0"}, {"A": 1}, ["A=x"]):
        with pytest.raises(InvalidArgumentError):
            validate.envs(bad)
