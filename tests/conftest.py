"""Shared fixtures: a private engine data dir per test session, and a sandbox per test."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Set before any engine exists: every test process (and the servers they spawn) shares it.
_DATA = Path(tempfile.mkdtemp(prefix="abx-test-", dir="/var/tmp"))
os.chmod(_DATA, 0o711)
os.environ["ABX_DATA_DIR"] = str(_DATA)
os.environ.setdefault("ABX_POOL_SIZE", "0")
# The stand-in internet of the network tests (netprobe.py): names and ranges on loopback.
os.environ.update(__import__("netprobe").ENV)
if os.geteuid() == 0:  # the CA its proxies trust upstream exists before any sandbox
    __import__("netprobe").upstream_ca()


def _engine_missing() -> str | None:
    if os.geteuid() != 0:
        return "the embedded engine needs root (mounts, runc)"
    if shutil.which("runc") is None:
        return "runc is not installed (bash scripts/setup.sh installs it)"
    return None


# Parallel workers (``-n N``) take a group of tests at a time and run it in order. A group
# is a test file (its module fixtures, a gateway or a sandbox, are made once), except the
# test cluster's: one cluster, whose tests stop nodes and must not overlap. The groups are
# drawn from test ids by this scheduler (xdist's own marks do not reach pytest 9's ids).
_K8S_ID = re.compile(r"^tests/kubernetes/|\[(?:.*-)?kubernetes(?:-.*)?\]$")


# The longest groups start first, so that no worker is left with one at the end.
_LONGEST = ("kubernetes", "tests/test_docs.py", "tests/runtime/test_rootless.py")
_CODE_LAST = "tests/kubernetes/test_k8s_code.py"


def group_of(nodeid: str) -> str:
    return "kubernetes" if _K8S_ID.search(nodeid) else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:  # xdist's own schedulers' hook
            return group_of(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests (marked: real runc sandboxes, servers, mounts) need root and runc;
    unit tests run in-process as any user, and are in the quick tier."""
    rank = {group: n for n, group in enumerate(_LONGEST)}
    # The code image's push (minutes) runs meanwhile in the background: its tests go last.
    items.sort(key=lambda item: (rank.get(group_of(item.nodeid), len(rank)),
                                 item.nodeid.startswith(_CODE_LAST)))
    for item in items:
        if item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.quick)  # a unit test is always in the quick tier
    reason = _engine_missing()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("integration") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A process that ran no session (xdist's controller, a collection-only run) still made
    its data dir at import: removed unless something is mounted under it."""
    with open("/proc/self/mountinfo") as mounts:
        if f" {_DATA}/" in mounts.read():
            return
    shutil.rmtree(_DATA, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _clean_engine_at_exit() -> Iterator[None]:
    yield
    if _engine_missing() is not None:  # unit tests only: no engine ever used the dir
        shutil.rmtree(_DATA, ignore_errors=True)
        return
    from agent_sandbox.backends.runc import supervisor
    from agent_sandbox.providers.local import local_provider

    engine = local_provider()
    engine.drain_pool()
    for info in engine.list():
        engine.kill(info.sandbox_id, delete_volume=True)
    for volume in engine.list_volumes():
        engine.delete_volume(volume.volume_id)
    supervisor.stop(_DATA)  # the session's lifecycle supervisor, before its dir goes
    engine.close()
    engine.backend.release_host_mounts()
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
    from agent_sandbox.backends.runc.templates import code_interpreter as template
    from agent_sandbox.core.errors import RuntimeUnavailableError
    from agent_sandbox.providers.local import local_provider

    try:
        template.ensure(local_provider().backend.templates)
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
