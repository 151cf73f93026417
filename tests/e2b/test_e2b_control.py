"""E2B's control plane through the real e2b SDK: create, info, list, timeout, pause and
connect, kill; and tenancy: key B can neither see nor touch key A's sandbox."""

from __future__ import annotations

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def test_create_list_timeout_kill(e2b_env: E2BGateway) -> None:
    from e2b import Sandbox, SandboxQuery

    sb = Sandbox.create(metadata={"purpose": "e2b-test", "odd": "a b&c=d%"}, timeout=120)
    try:
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.metadata == {"purpose": "e2b-test", "odd": "a b&c=d%"}
        assert info.template_id == "base"
        listed = Sandbox.list(query=None).next_items()
        assert sb.sandbox_id in [s.sandbox_id for s in listed]
        for wanted, found in (({"purpose": "e2b-test"}, True), ({"odd": "a b&c=d%"}, True),
                              ({"purpose": "x"}, False)):
            query = SandboxQuery(metadata=wanted)
            ids = [s.sandbox_id for s in Sandbox.list(query=query).next_items()]
            assert (sb.sandbox_id in ids) is found
        sb.set_timeout(300)
        assert sb.is_running()
    finally:
        assert sb.kill() in (True, None)
    assert sb.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_pause_then_connect_resumes_with_state(e2b_env: E2BGateway) -> None:
    import httpx2 as httpx
    from e2b import Sandbox

    sb = Sandbox.create()
    try:
        assert sb.pause() in (True, None, sb.sandbox_id)
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        listed = Sandbox.list(query=None).next_items()
        assert [s.state.value for s in listed if s.sandbox_id == sb.sandbox_id] == ["paused"]
        again = Sandbox.connect(sb.sandbox_id)
        assert again.get_info().state.value == "running"
        health = httpx.get(f"{e2b_env.url}/health", headers={
            "E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
            "X-Access-Token": again._envd_access_token})
        assert health.status_code == 204
    finally:
        sb.kill()


def test_network_options_map_to_policies_within_the_ceiling(e2b_env: E2BGateway) -> None:
    import httpx2 as httpx
    from e2b import Sandbox

    sb = Sandbox.create(network={"allow_out": ["pypi.org"], "deny_out": ["0.0.0.0/0"]})
    try:
        ours = httpx.get(f"{e2b_env.url}/v1/sandboxes/{sb.sandbox_id}",
                         headers={"Authorization": f"Bearer {e2b_env.keys['a']}"}).json()
        assert ours["network"] == {"mode": "allowlist", "allow_out": ["pypi.org"],
                                   "deny_out": []}
        assert sb.get_info().allow_internet_access is True
        sb.update_network({"allow_internet_access": False})
        ours = httpx.get(f"{e2b_env.url}/v1/sandboxes/{sb.sandbox_id}",
                         headers={"Authorization": f"Bearer {e2b_env.keys['a']}"}).json()
        assert ours["network"]["mode"] == "off"
    finally:
        sb.kill()
    plain = Sandbox.create()
    try:
        assert plain.get_info().allow_internet_access is False  # off unless asked
    finally:
        plain.kill()


def test_create_envs_and_the_users_files(e2b_env: E2BGateway) -> None:
    """Env vars given at create reach every command; commands run as E2B's ``user`` in its
    home, and a file ``files.write`` made is theirs to change (as in E2B)."""
    from e2b import Sandbox

    sb = Sandbox.create(envs={"GREETING": "hello"})
    try:
        assert sb.commands.run("echo $GREETING; whoami; pwd").stdout == \
            "hello\nuser\n/home/user\n"
        sb.files.write("notes/today.txt", "a\n")
        sb.commands.run("echo b >> notes/today.txt && touch notes/more")
        assert sb.files.read("/home/user/notes/today.txt") == "a\nb\n"
        assert sb.commands.run("echo $GREETING", envs={"GREETING": "hi"}).stdout == "hi\n"
    finally:
        sb.kill()
