"""/files/archive over plain HTTP: GNU tar and Python's tarfile at the other end, statuses
before the body, and other tenants' sandboxes out of reach."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from _gw import Gateway

from agent_sandbox.core.errors import NotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory


def test_gnu_tar_in_and_python_tarfile_out(gw: Gateway, sandbox_a: str,
                                           tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep" / ("x" * 120)).mkdir(parents=True)  # a GNU long name
    (src / "deep" / ("x" * 120) / "f.txt").write_text("gnu")
    os.symlink("deep", src / "link")
    archive = subprocess.run(["tar", "-c", "-C", str(src), "."], capture_output=True,
                             check=True).stdout
    url = f"/v1/sandboxes/{sandbox_a}/files/archive"
    with gw.http("a") as http:
        put = http.put(url, params={"path": "/workspace/gnu"}, content=archive,
                       headers={"Content-Type": "application/x-tar"})
        assert put.status_code == 200, put.text
        assert put.json() == {"files": 1, "dirs": 2, "symlinks": 1, "size": 3, "skipped": []}
        got = http.get(url, params={"path": "/workspace/gnu"})
        assert got.status_code == 200 and got.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(got.content), mode="r|") as tar:
        members = {m.name: m for m in tar}
    assert members["link"].issym() and members["link"].linkname == "deep"
    assert members[f"deep/{'x' * 120}/f.txt"].size == 3
    assert all(m.uid == 0 and m.uname == "" for m in members.values())


def test_statuses_come_before_the_body(gw: Gateway, sandbox_a: str) -> None:
    url = f"/v1/sandboxes/{sandbox_a}/files/archive"
    gw.provider("a").write_file(sandbox_a, "/workspace/plain", "x")
    with gw.http("a") as http:
        missing = http.get(url, params={"path": "/workspace/nope"})
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
        plain = http.get(url, params={"path": "/workspace/plain"})
        assert plain.status_code == 400 and "not a directory" in plain.json()["message"]
        junk = http.put(url, params={"path": "/workspace/j"}, content=b"\x05" * 5000)
        assert junk.status_code == 400 and "not a valid tar stream" in junk.json()["message"]
        onto = http.put(url, params={"path": "/workspace/plain"}, content=bytes(1024))
        assert onto.status_code == 400 and "not a directory" in onto.json()["message"]
        relative = http.get(url, params={"path": "workspace"})
        assert relative.status_code in (400, 422)


def test_other_keys_cannot_reach_the_archive(gw: Gateway, sandbox_a: str) -> None:
    b = gw.provider("b")
    with pytest.raises(NotFoundError, match="not found"):
        b.read_dir_archive(sandbox_a, "/workspace")
    with pytest.raises(NotFoundError, match="not found"):
        b.write_dir_archive(sandbox_a, "/workspace/x", [bytes(1024)])
    assert not gw.provider("a").exists(sandbox_a, "/workspace/x")
