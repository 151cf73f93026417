"""The warm pool on the cluster: whole sandboxes made ahead, claimed by one conditional
patch of their Secret, refilled by the supervisor; a create that does not fit makes its
own."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_sandbox.config.settings import Settings
from agent_sandbox.providers.kubernetes import kubernetes_service
from agent_sandbox.service.service import SandboxService

pytestmark = pytest.mark.integration


def _pooled(provider: SandboxService) -> list[str]:
    return [s["metadata"]["labels"]["abx.dev/sandbox"]
            for s in provider.backend.supervisor.pool.pooled("base")]


def _fill(provider: SandboxService, size: int) -> list[str]:
    deadline = time.monotonic() + 120
    while len(_pooled(provider)) < size:
        assert time.monotonic() < deadline, "the pool did not fill in 120 s"
        provider.backend.pass_once()
    return _pooled(provider)


def test_a_create_claims_a_warm_sandbox_with_one_write(k8s_cluster: Any) -> None:
    settings = Settings(**k8s_cluster.env, ABX_POOL_SIZE="1", ABX_POOL_TEMPLATES="base")
    provider = kubernetes_service(settings)
    made: list[str] = []
    try:
        (warm,) = _fill(provider, 1)
        assert warm not in {s.sandbox_id for s in provider.list()}  # pooled: not listed
        writes: list[str] = []
        patch = provider.backend.cluster.patch
        provider.backend.cluster.patch = lambda kind, name, body: (  # type: ignore[method-assign]
            writes.append(kind), patch(kind, name, body))[1]
        started = time.perf_counter()
        info = provider.create(template="base", metadata={"who": "a"}, owner="key-a",
                               timeout=120)
        claimed_in = time.perf_counter() - started
        provider.backend.cluster.patch = patch  # type: ignore[method-assign]
        made.append(info.sandbox_id)
        assert info.sandbox_id == warm and writes == ["Secret"]
        assert (info.owner, info.metadata, info.timeout) == ("key-a", {"who": "a"}, 120)
        assert provider.run(warm, "echo warm; hostname").stdout == f"warm\n{warm}\n"
        print(f"warm create {claimed_in * 1e3:.0f} ms")

        (again,) = _fill(provider, 1)  # refilled
        assert again != warm
        # Not the pool's shape (a smaller sandbox): made afresh, the warm one left alone.
        own = provider.create(template="base", memory_mb=64)
        made.append(own.sandbox_id)
        assert own.sandbox_id != again and _pooled(provider) == [again]
    finally:
        for sid in made:
            provider.kill(sid, delete_volume=True)
        provider.drain_pool()
        provider.close()
    assert _pooled(provider) == []
