"""``abx mcp deploy``: each target's files, the token handling, the fc bootstrap running, the
wheel the artifacts install, and the docker image built where a docker daemon runs."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx2 as httpx
import pytest
from conftest import Abx

from agent_sandbox import __version__
from agent_sandbox.surfaces.cli import deploy_files

pytestmark = pytest.mark.integration

yaml = pytest.importorskip("yaml")
KEY = "sk-deploy-key-0123456789"


def deploy(abx: Abx, target: str, out: Path, *extra: str) -> dict:
    return abx("mcp", "deploy", "--target", target, "--generate-token", "--api-key", KEY,
               "--output-dir", str(out), "--json", *extra).json()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("target", ["fc", "docker", "kubernetes"])
def test_refused_without_a_token(abx: Abx, tmp_path: Path, target: str) -> None:
    out = tmp_path / "art"
    r = abx("mcp", "deploy", "--target", target, "--output-dir", str(out), check=2)
    assert "bearer token" in r.err and not out.exists()
    empty = tmp_path / "empty"
    empty.write_text("")
    abx("mcp", "deploy", "--target", target, "--auth-token-file", str(empty), "--output-dir",
        str(out), check=2)


def test_printed_template_masks_the_token(abx: Abx, tmp_path: Path) -> None:
    out = tmp_path / "art"
    r = abx("mcp", "deploy", "--generate-token", "--api-key", KEY, "--output-dir", str(out))
    config = yaml.safe_load((out / "code" / "config.yaml").read_text())
    token = config["mcp_auth_token"]
    assert len(token) >= 32
    assert "<FC_HTTP_TRIGGER_URL>/mcp" in r.out and "Bearer " + token[:4] in r.out
    assert token not in r.out + r.err and KEY not in r.out + r.err
    assert "Mcp-Session-Id" in r.out and "Never commit" in r.err
    # A second deploy into the same place needs --force.
    assert "--force" in abx("mcp", "deploy", "--generate-token", "--output-dir", str(out),
                            check=1).err


def test_fc_artifact_and_bootstrap_answers_health(abx: Abx, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("fc-test-token-0123456789abcdef\n")
    out = tmp_path / "fc"
    info = abx("mcp", "deploy", "--target", "fc", "--auth-token-file", str(token_file),
               "--api-key", KEY, "--output-dir", str(out), "--json").json()
    assert info["token"] == "fc-t****" and "fc-test-token" not in str(info)
    config_path = out / "code" / "config.yaml"
    assert mode(config_path) == 0o600 and mode(out / "code" / "bootstrap") & 0o111
    config = yaml.safe_load(config_path.read_text())
    assert config["mcp_auth_token"] == "fc-test-token-0123456789abcdef"
    assert config["sandbox_api_key"] == KEY
    assert "config.yaml" in (out / ".gitignore").read_text()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**abx.env, "FC_SERVER_PORT": str(port), "ABX_FC_HOST": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, str(out / "code" / "bootstrap")], cwd=out / "code",
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/health"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                unauth = httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "bootstrap did not serve /health"
                time.sleep(0.2)
        assert unauth.status_code == 401
        ok = httpx.get(url, headers={"Authorization": f"Bearer {config['mcp_auth_token']}"},
                       timeout=5)
        assert ok.status_code == 200 and ok.json()["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=40)
    # Without a token the bootstrap refuses to start.
    config_path.write_text(config_path.read_text().replace(config["mcp_auth_token"], ""))
    env.pop("ABX_MCP_AUTH_TOKEN", None)
    bad = subprocess.run([sys.executable, str(out / "code" / "bootstrap")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "without a bearer token" in bad.stderr


def test_docker_artifact(abx: Abx, tmp_path: Path) -> None:
    out = tmp_path / "docker"
    info = deploy(abx, "docker", out, "--base-url", "https://gw.example")
    assert set(info["files"]) >= {"Dockerfile", "compose.yaml", "abx-mcp.env"}
    compose = yaml.safe_load((out / "compose.yaml").read_text())
    service = compose["services"]["agent-sandbox-mcp"]
    assert service["ports"] == ["9000:9000"] and service["env_file"] == ["abx-mcp.env"]
    assert service["environment"]["ABX_SANDBOX_BASE_URL"] == "https://gw.example"
    assert "privileged" not in service  # a gateway does the sandboxing
    env_file = out / "abx-mcp.env"
    assert mode(env_file) == 0o600
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines()
                  if line and not line.startswith("#"))
    assert values["ABX_SANDBOX_API_KEY"] == KEY and len(values["ABX_MCP_AUTH_TOKEN"]) >= 32
    dockerfile = (out / "Dockerfile").read_text()
    assert "agent_sandbox.surfaces.mcp.http_app:asgi_app" in dockerfile and "9000" in dockerfile
    assert values["ABX_MCP_AUTH_TOKEN"] not in dockerfile + (out / "compose.yaml").read_text()
    assert "abx-mcp.env" in (out / ".dockerignore").read_text()


def test_kubernetes_artifact(abx: Abx, tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    deploy(abx, "kubernetes", out)
    docs = {}
    for name in ("secret.yaml", "deployment.yaml", "service.yaml"):
        doc = yaml.safe_load((out / name).read_text())
        docs[doc["kind"]] = doc
    assert mode(out / "secret.yaml") == 0o600
    token = docs["Secret"]["stringData"]["ABX_MCP_AUTH_TOKEN"]
    assert len(token) >= 32 and docs["Secret"]["stringData"]["ABX_SANDBOX_API_KEY"] == KEY
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "agent-sandbox-mcp"}}]
    assert container["ports"][0]["containerPort"] == 9000
    assert docs["Service"]["spec"]["ports"][0]["port"] == 9000
    assert token not in (out / "deployment.yaml").read_text()
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {"secret.yaml", "deployment.yaml", "service.yaml"}


PACKAGE = Path(__file__).resolve().parents[2] / "agent_sandbox"


def test_the_wheel_the_artifact_installs(abx: Abx, tmp_path: Path) -> None:
    """abx-sandbox built from this checkout: every module byte for byte (the guest too), the
    abx entry point, and it installs offline into a fresh venv with --no-deps."""
    out = tmp_path / "docker"
    info = deploy(abx, "docker", out)
    name = f"abx_sandbox-{__version__}-py3-none-any.whl"
    assert info["package"]["wheel"] == name and name in info["files"]
    assert str(PACKAGE.parent) in info["package"]["description"]
    assert f'pip install --no-cache-dir "/tmp/{name}"' in (out / "Dockerfile").read_text()
    source = {str(p.relative_to(PACKAGE.parent)): p.read_bytes() for p in PACKAGE.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    with zipfile.ZipFile(out / name) as whl:
        members = {n for n in whl.namelist() if n.startswith("agent_sandbox/")}
        assert members == set(source), members ^ set(source)
        assert all(whl.read(n) == source[n] for n in members)
        info_dir = f"abx_sandbox-{__version__}.dist-info"
        meta = email.parser.Parser().parsestr(whl.read(f"{info_dir}/METADATA").decode())
        entry_points = whl.read(f"{info_dir}/entry_points.txt").decode()
    assert "agent_sandbox/guest/agent.py" in members and "agent_sandbox/py.typed" in members
    assert meta["Name"] == "abx-sandbox" and meta["Version"] == __version__
    assert re.search(r"^\[console_scripts\]\nabx = agent_sandbox\.surfaces\.cli\.main:main$",
                     entry_points, re.M), entry_points
    # A fresh venv, offline (no index, no config, no find-links), the wheel alone.
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_CONFIG_FILE"] = os.devnull
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                    str(out / name)], check=True, env=env, cwd=tmp_path, timeout=300)
    probe = subprocess.run(
        [str(python), "-c", "import agent_sandbox, agent_sandbox.guest.server as g; "
         "print(agent_sandbox.__version__, agent_sandbox.__file__, g.__name__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert probe.returncode == 0, probe.stderr
    version, where, _ = probe.stdout.split()
    assert version == __version__ and where.startswith(str(venv))
    assert "agent_sandbox.surfaces.cli.main" in (venv / "bin" / "abx").read_text()


def _docker_missing() -> str | None:
    """Why no image can be built here (None: a daemon answers)."""
    if shutil.which("docker") is None:
        return "no docker command"
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no docker daemon: `docker info` did not answer in 30 s"
    if r.returncode != 0 or not r.stdout.strip():
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        return "no docker daemon: " + (lines[-1] if lines else f"docker info exited {r.returncode}")
    return None


def _base_image_missing() -> str | None:
    """Why the Dockerfile's base image cannot be had (None: present or pulled)."""
    image = deploy_files.IMAGE_BASE
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                      timeout=60).returncode == 0:
        return None
    r = subprocess.run(["docker", "pull", image], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        return f"Docker Hub unreachable (docker pull {image}: {lines[-1] if lines else '?'})"
    return None


def test_docker_image_builds_and_carries_the_engine(abx: Abx, tmp_path: Path) -> None:
    reason = _docker_missing() or _base_image_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "docker"
    deploy(abx, "docker", out)  # no --base-url: the embedded engine's image
    tag = f"abx-deploy-test:{os.getpid()}"
    build = subprocess.run(["docker", "build", "-t", tag, str(out)], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-4000:]
    try:
        probe = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c",
             "command -v runc mkfs.ext4 ip nft unshare /usr/bin/python3 && abx --version"
             " && test ! -e /tmp/*.whl && ! ls /abx-mcp.env /src 2>/dev/null"],
            capture_output=True, text=True, timeout=300)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert f"abx {__version__}" in probe.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
