"""A warm pool of a code template keeps each pooled sandbox's default kernel started, so
the first cell of a sandbox it hands out finds a kernel running (issue 34: a first cell in
<= 300 ms); a sandbox claimed with envs gets a kernel that has them."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.integration


def _wait(what, timeout: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_pooled_code_sandbox_has_its_kernel_running_before_its_first_cell(
        code_template: str) -> None:
    from agent_sandbox.config.engine import EngineConfig
    from agent_sandbox.providers.local import embedded_service

    engine = embedded_service(EngineConfig(pool_size=1, pool_templates=(code_template,)),
                              reaper=False)
    store = engine.backend.store

    def warm_one() -> bool:
        pooled = [r for r in store.list_sandboxes()
                  if r.state == "pooled" and r.template == code_template]
        return bool(pooled) and (engine.backend.sandbox_dir(pooled[0].id) / "kernels"
                                 / "default.json").exists() and (pooled[0].id, "default") \
            in engine.code._kernels
    made = []
    try:
        engine.backend.open()
        _wait(warm_one)
        sid = engine.create(template=code_template).sandbox_id
        made.append(sid)
        assert [c.id for c in engine.list_code_contexts(sid)] == ["default"]  # before any cell
        r = engine.run_code(sid, "x = 41\nx + 1")
        assert (r.text, r.kernel_restarted) == ("42", False)

        _wait(warm_one)  # the refill, with its own kernel
        sid = engine.create(template=code_template, envs={"ABX_POOL_T": "given"}).sandbox_id
        made.append(sid)
        r = engine.run_code(sid, "import os; os.environ.get('ABX_POOL_T')")
        assert r.text == "'given'"
    finally:
        engine.close()
        _wait(lambda: not any(r.state == "creating" for r in store.list_sandboxes()), 60)
        engine.drain_pool()
        for sid in made:
            engine.kill(sid, delete_volume=True)


def test_a_warm_up_that_comes_after_the_claim_starts_no_kernel_without_its_envs(
        code_template: str) -> None:
    """The pool marks a sandbox pooled (claimable) before it warms its kernel: a create
    with envs may claim it in between, and unwarm then finds nothing to end. The warm-up
    that follows must not start the claimer's kernel from the pool's record (no envs)."""
    import dataclasses

    from agent_sandbox.config.engine import EngineConfig
    from agent_sandbox.providers.local import embedded_service

    engine = embedded_service(EngineConfig(pool_size=0), reaper=False)
    sid = engine.create(template=code_template, envs={"ABX_POOL_T": "given"}).sandbox_id
    try:
        pools_row = dataclasses.replace(engine.backend.record(sid), envs={}, owner="")
        engine.code.warm(pools_row)  # the pool thread, late
        r = engine.run_code(sid, "import os; os.environ.get('ABX_POOL_T')")
        assert r.text == "'given'"
    finally:
        engine.kill(sid, delete_volume=True)
        engine.close()
