"""The end of life on the cluster: the Kubernetes backend's supervisor acts on the service's
decisions (a lifetime over, an idle timeout that kills), with the volume as asked."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.providers.kubernetes import kubernetes_service

pytestmark = pytest.mark.integration


def test_lifetime_and_on_timeout_kill_end_pods(k8s_cluster: Any) -> None:
    service = kubernetes_service(Settings(**k8s_cluster.env))
    try:
        timed = service.create(lifetime=60)
        idle = service.create(timeout=30, on_timeout="kill", keep_volume=False)
        service.backend.pass_once(now=time.time() + 40)  # idle past 30 s: ended
        assert service.info(timed.sandbox_id).state == "running"
        with pytest.raises(NotFoundError):
            service.info(idle.sandbox_id)
        service.backend.pass_once(now=time.time() + 61)  # the lifetime is over
        with pytest.raises(NotFoundError):
            service.info(timed.sandbox_id)
        volumes = {v.volume_id for v in service.list_volumes()}
        assert timed.volume_id in volumes and idle.volume_id not in volumes
        service.delete_volume(timed.volume_id)
    finally:
        for info in service.list():
            service.kill(info.sandbox_id, delete_volume=True)
        service.close()
