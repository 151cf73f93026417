"""What the gateway's E2B API does not serve answers at once with a clear error naming
it (HTTP 501 with E2B's ``{code, message}``; the SDK raises its own exception with that
message), never a hang or a misleading "sandbox not found"."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def _calls(sb: object) -> dict[str, Callable[[], object]]:
    from e2b import Secret, Volume

    return {
        "volume": lambda: Volume.create("data"),
        # E2B's secret store: ours (abx secrets, /v1/secrets) holds the rule with the value
        "secret": lambda: Secret.create("gh", "value-0123456789"),
    }


@pytest.mark.timeout(120)
def test_unsupported_calls_fail_fast_and_say_so(e2b_env: E2BGateway,
                                                e2b_sandbox: object) -> None:
    failures = {}
    for name, call in _calls(e2b_sandbox).items():
        with pytest.raises(Exception) as caught:  # noqa: B017 - each SDK has its own type
            call()
        failures[name] = str(caught.value)
    for name, message in failures.items():
        assert "not supported" in message and "docs/e2b.md" in message, (name, message)
        assert "not found" not in message.lower(), (name, message)
    assert e2b_sandbox.is_running()  # type: ignore[attr-defined]


def test_unsupported_network_options_are_refused_by_name(e2b_env: E2BGateway) -> None:
    from e2b import Sandbox
    from e2b.exceptions import InvalidArgumentException, SandboxException

    before = len(Sandbox.list().next_items())
    with pytest.raises((InvalidArgumentException, SandboxException)) as caught:
        Sandbox.create(network={"allow_out": ["pypi.org"], "dns_servers": ["1.1.1.1"]})
    assert "dnsServers" in str(caught.value) and "not supported" in str(caught.value)
    assert len(Sandbox.list().next_items()) == before  # nothing was made
