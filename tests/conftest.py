"""Shared fixtures: a private engine data dir per test session, and a sandbox per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Set before any engine exists: every test process (and the servers they spawn) shares it.
_DATA = Path(tempfile.mkdtemp(prefix="abx-test-", dir="/var/tmp"))
os.chmod(_DATA, 0o711)
os.environ["ABX_DATA_DIR"] = str(_DATA)
os.environ.setdefault("ABX_POOL_SIZE", "0")
# The stand-in internet of the network tests (netprobe.py): names and ranges on loopback.
os.environ.update(__import__("netprobe").ENV)


def _engine_missing() -> str | None:
    if os.geteuid() != 0:
        return "the embedded engine needs root (mounts, runc)"
    if shutil.which("runc") is None:
        return "runc is not installed (bash scripts/setup.sh installs it)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests (marked: real runc sandboxes, servers, mounts) need root and runc;
    unit tests run in-process as any user."""
    reason = _engine_missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("integration") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _clean_engine_at_exit() -> Iterator[None]:
    yield
    if _engine_missing() is not None:  # unit tests only: no engine ever used the dir
        shutil.rmtree(_DATA, ignore_errors=True)
        return
    from agent_sandbox.providers.local import local_provider
    from agent_sandbox.runtime import supervisor

    engine = local_provider()
    engine.drain_pool()
    for info in engine.list():
        engine.kill(info.sandbox_id, delete_volume=True)
    for volume in engine.list_volumes():
        engine.delete_volume(volume.volume_id)
    supervisor.stop(_DATA)  # the session's lifecycle supervisor, before its dir goes
    engine.close()
    engine.release_host_mounts()
    shutil.rmtree(_DATA, ignore_errors=True)


@pytest.fixture
def sandbox() -> Iterator[object]:
    from agent_sandbox import Sandbox

    sb = Sandbox.create()
    yield sb
    try:
        sb.kill(delete_volume=True)
    except Exception:  # noqa: BLE001 - a test may have killed it already
        pass


@pytest.fixture(scope="session")
def code_template() -> str:
    """code-interpreter-v1, built once (as root: in the host's shared templates directory,
    where later sessions and every user find it), so no request waits a minute for it."""
    from agent_sandbox.errors import RuntimeUnavailableError
    from agent_sandbox.providers.local import local_provider
    from agent_sandbox.runtime import code_template as template

    try:
        template.ensure(local_provider().templates)
    except RuntimeUnavailableError as exc:
        if "registry could not be reached" in str(exc) or "is unreachable" in str(exc):
            pytest.skip(f"{template.NAME} cannot be built: the package registry is unreachable")
        raise
    return template.NAME


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[object]:
    """A namespace of the test cluster with ``base`` pushed (tests/k8scluster.py); skips
    with the reason when the cluster is not running here."""
    import k8scluster

    reason = k8scluster.missing()
    if reason:
        pytest.skip(reason)
    with k8scluster.session_namespace() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def local_users() -> Iterator[object]:
    """Factory of real unprivileged users (``local_users.create()``); skips without root."""
    from localusers import LocalUsers

    users = LocalUsers()
    reason = users.missing()
    if reason:
        pytest.skip(reason)
    yield users
    users.cleanup()
