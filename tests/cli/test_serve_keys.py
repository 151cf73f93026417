"""``abx serve``, ``abx keys`` and ``abx daemon``, through the real ``abx`` executable."""

from __future__ import annotations

import grp
import os
import re
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from agent_sandbox.surfaces.gateway.process import free_port

pytestmark = pytest.mark.integration

# Not imported from conftest: another directory's conftest may own that module name
# when several test directories are collected in one run.
ABX = Path(sys.executable).parent / "abx"
Abx = Any  # the ``abx`` fixture of tests/cli/conftest.py


def _exe() -> list[str]:
    return [str(ABX)] if ABX.exists() else [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


class Served:
    """``abx serve ...`` as a child process, stopped at the end."""

    def __init__(self, abx: Abx, *args: str) -> None:
        self.proc = subprocess.Popen([*_exe(), "serve", *args], cwd=abx.cwd, env=abx.env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait_until(self, ready: object, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"abx serve exited: {self.proc.communicate()}")
            try:
                if ready():  # type: ignore[operator]
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("abx serve did not come up")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.communicate()
        return self.proc.returncode


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    return tmp_path / "keys" / "keys.db"


@pytest.fixture
def abx_group_restored() -> Iterator[None]:
    """``abx daemon install`` may create group abx; remove it afterwards if it did."""
    try:
        grp.getgrnam("abx")
        existed = True
    except KeyError:
        existed = False
    yield
    if not existed:
        subprocess.run(["groupdel", "abx"], capture_output=True)


def test_keys_create_list_revoke(abx: Abx, keys_file: Path) -> None:
    kf = str(keys_file)
    r = abx("keys", "create", "--name", "ci-bot", "--max-sandboxes", "3", "--api-keys-file", kf)
    token = r.out.strip()
    assert token.startswith("abx_") and len(r.out.splitlines()) == 1  # the secret alone
    assert "not shown again" in r.err
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    assert token.encode() not in keys_file.read_bytes()  # hashed at rest

    admin = abx("keys", "create", "--name", "ops", "--admin", "--api-keys-file", kf, "--json")
    admin_key = admin.json()
    assert admin_key["admin"] is True and admin_key["token"].startswith("abx_")
    e2b = abx("keys", "create", "--name", "e2b-sdk", "--e2b", "--api-keys-file", kf).out.strip()
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", e2b)  # the shape E2B's SDKs expect

    table = abx("keys", "list", "--api-keys-file", kf)
    assert "ci-bot" in table.out and "ops" in table.out and "live" in table.out
    assert token not in table.out and admin_key["token"] not in table.out
    listed = abx("keys", "list", "--api-keys-file", kf, "--json").json()
    assert [k["name"] for k in listed] == ["ci-bot", "ops", "e2b-sdk"]
    assert all("token" not in k and "hash" not in k for k in listed)
    ci = listed[0]
    assert ci["max_sandboxes"] == 3 and ci["revoked"] is False

    r = abx("keys", "revoke", ci["id"], "--api-keys-file", kf)
    assert f"revoked API key {ci['id']}" in r.out
    listed = abx("--json", "keys", "list", "--api-keys-file", kf).json()
    assert listed[0]["revoked"] is True and listed[1]["revoked"] is False
    missing = abx("keys", "revoke", "key-nope", "--api-keys-file", kf, check=None)
    assert missing.code != 0 and "not found" in missing.err


def test_serve_refuses_beyond_loopback_without_keys(abx: Abx, keys_file: Path) -> None:
    r = abx("serve", "--host", "0.0.0.0", "--port", str(free_port()), "--api-keys-file",
            str(keys_file), check=None, timeout=60)
    assert r.code == 2
    assert "refusing to listen on 0.0.0.0" in r.err and "abx keys create" in r.err


def test_serve_over_tcp_with_keys(abx: Abx, keys_file: Path) -> None:
    kf = str(keys_file)
    token = abx("keys", "create", "--name", "t", "--api-keys-file", kf).out.strip()
    port = free_port()
    served = Served(abx, "--port", str(port), "--api-keys-file", kf)
    url = f"http://127.0.0.1:{port}"
    try:
        served.wait_until(lambda: httpx.get(url + "/health", timeout=2).status_code == 200)
        assert httpx.get(url + "/v1/sandboxes", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.get(url + "/v1/sandboxes", headers=auth, timeout=10)
        assert r.status_code == 200 and r.json() == []
        key_id = abx("keys", "list", "--api-keys-file", kf, "--json").json()[0]["id"]
        abx("keys", "revoke", key_id, "--api-keys-file", kf)
        assert httpx.get(url + "/v1/sandboxes", headers=auth, timeout=10).status_code == 401
    finally:
        served.stop()


def test_serve_unix_and_daemon_status(abx: Abx, tmp_path: Path, keys_file: Path,
                                      abx_group_restored: None) -> None:
    sock = str(tmp_path / "d.sock")
    gone = abx("daemon", "status", "--socket", sock, "--unit-dir", str(tmp_path), check=1)
    assert "not reachable" in gone.out and "abx daemon install" in gone.err
    served = Served(abx, "--unix", sock, "--api-keys-file", str(keys_file))
    transport = httpx.HTTPTransport(uds=sock)
    try:
        with httpx.Client(transport=transport, base_url="http://abx", timeout=10) as http:
            served.wait_until(lambda: http.get("/health").status_code == 200)
            st = os.stat(sock)
            assert stat.S_IMODE(st.st_mode) == 0o660 and grp.getgrgid(st.st_gid).gr_name == "abx"
            # No key over the socket: the peer (root here) is the identity.
            assert http.get("/v1/sandboxes").status_code == 200
        status = abx("daemon", "status", "--socket", sock, "--unit-dir", str(tmp_path),
                     "--json").json()
        assert status["socket"]["reachable"] and status["health"]["status_code"] == 200
        assert status["socket"]["mode"] == "0660" and status["installed"] is False
        human = abx("daemon", "status", "--socket", sock, "--unit-dir", str(tmp_path))
        assert "answers" in human.out
    finally:
        assert served.stop() == 0
    assert not os.path.exists(sock)


def test_daemon_install_writes_the_unit(abx: Abx, tmp_path: Path,
                                        abx_group_restored: None) -> None:
    from agent_sandbox.surfaces.cli.daemon_cmd import systemd_running

    unit_dir = tmp_path / "units"
    r = abx("daemon", "install", "--unit-dir", str(unit_dir))
    unit = unit_dir / "abx.service"
    text = unit.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert shlex.split(exec_start[len("ExecStart="):]) == [
        *_exe(), "serve", "--unix", "/run/abx/abx.sock", "--group", "abx"]
    assert "RuntimeDirectory=abx\n" in text and "KillMode=process\n" in text
    assert "[Install]\nWantedBy=multi-user.target" in text
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    grp.getgrnam("abx")  # created
    if not systemd_running():
        assert "systemd is not running" in r.out and "serve --unix /run/abx/abx.sock" in r.out
    else:
        assert "not enabled" in r.out  # a unit dir systemd does not read
    st = abx("daemon", "status", "--unit-dir", str(unit_dir), "--socket",
             str(tmp_path / "none.sock"), "--json", check=1).json()
    assert st["installed"] is True

    r = abx("daemon", "uninstall", "--unit-dir", str(unit_dir))
    assert f"removed {unit}" in r.out and not unit.exists()
    again = abx("daemon", "uninstall", "--unit-dir", str(unit_dir))
    assert "was not installed" in again.out


def test_daemon_install_custom_socket_and_data_dir(abx: Abx, tmp_path: Path,
                                                   abx_group_restored: None) -> None:
    r = abx("daemon", "install", "--unit-dir", str(tmp_path), "--socket", "/srv/abx/s.sock",
            "--data-dir", "/srv/abx/data", "--no-start", "--json")
    assert r.json()["started"] is False
    text = (tmp_path / "abx.service").read_text()
    assert "--unix /srv/abx/s.sock" in text and "RuntimeDirectory" not in text
    assert "Environment=ABX_DATA_DIR=/srv/abx/data" in text
    bad = abx("daemon", "install", "--unit-dir", str(tmp_path), "--socket", "rel.sock",
              check=2)
    assert "absolute" in bad.err


def test_daemon_install_enables_and_starts_under_systemd(abx: Abx, tmp_path: Path,
                                                         abx_group_restored: None) -> None:
    from agent_sandbox.surfaces.cli.daemon_cmd import DEFAULT_UNIT_DIR, UNIT_NAME, systemd_problem

    problem = systemd_problem()
    if problem:
        pytest.skip(f"enabling and starting the unit needs systemd as init: {problem}")
    unit = DEFAULT_UNIT_DIR / UNIT_NAME
    if unit.exists():
        pytest.skip(f"{unit} is already installed on this host; not replacing it")
    sock = f"/run/abx-test-{os.getpid()}/abx.sock"  # its own RuntimeDirectory
    try:
        r = abx("daemon", "install", "--socket", sock, "--data-dir", str(tmp_path / "data"),
                "--json")
        assert r.json()["started"] is True and unit.exists()
        deadline = time.monotonic() + 60
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = abx("daemon", "status", "--socket", sock, "--json", check=None).json()
            if (status.get("health") or {}).get("status_code") == 200:
                break
            time.sleep(0.2)
        assert status["active"] == "active" and status["socket"]["mode"] == "0660", status
    finally:
        abx("daemon", "uninstall", check=None)
    assert not unit.exists() and not os.path.exists(sock)
