"""A tenant with an ordinary (non-admin) API key attacks the host through the REST API
the way a sandbox's own code would: links planted in its run directory, its guest ended,
then the gateway made to reboot it and reset it. The host must create nothing."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from _gw import Gateway

pytestmark = pytest.mark.integration


def test_planted_links_through_the_gateway(gw: Gateway, sandbox_a: str) -> None:
    a = gw.provider("a")
    target = Path("/var/tmp") / f"abx-gw-pwned-{secrets.token_hex(6)}"
    plant = ("for n in guest.log guest.sock slirp.log; do rm -f /.abx/run/$n; "
             f"ln -s '{target}' /.abx/run/$n; done; echo planted")
    try:
        assert a.run(sandbox_a, plant).stdout == "planted\n"
        a.start(sandbox_a, "sleep 0.3; kill -TERM 1")  # the guest ends; next call reboots
        time.sleep(1.0)
        assert a.run(sandbox_a, "echo rebooted").stdout == "rebooted\n"
        assert a.run(sandbox_a, plant).stdout == "planted\n"
        with gw.http("a") as http:
            reset = http.post(f"/v1/sandboxes/{sandbox_a}/reset-rootfs")
        assert reset.status_code == 200, reset.text
        assert a.run(sandbox_a, "echo reset").stdout == "reset\n"
        assert not target.exists() and not target.is_symlink()
    finally:
        target.unlink(missing_ok=True)


def test_a_huge_json_body_without_a_key_is_refused_unread(gw: Gateway) -> None:
    """A JSON body is read whole before its caller is known: past 16 MiB it is a 413,
    whoever sends it, and the gateway never holds the rest (it was 600 MB for 300 MB)."""
    import httpx2 as httpx
    from _peak_rss import reset_peak, status_kb

    pid = gw.proc.proc.pid  # type: ignore[union-attr]
    before = reset_peak(pid)

    def body():  # chunked, no Content-Length: the limit must count what it reads
        for _ in range(200):
            yield b" " * (1 << 20)

    for path in ("/v1/sandboxes", "/v1/sandboxes/sbx-aaaaaaaaaa/commands"):
        reply = httpx.post(gw.url + path, content=body(),
                           headers={"Content-Type": "application/json"}, timeout=60)
        assert reply.status_code == 413, reply.text
        assert "16 MiB" in reply.json()["message"]
    assert status_kb(pid, "VmHWM") - before < 64 * 1024  # KiB: far below the 200 MiB sent
    assert httpx.get(gw.url + "/health", timeout=10).status_code == 200
