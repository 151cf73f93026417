"""The files ``abx mcp deploy`` writes, as pure functions of its settings (no build, no CLI)."""

from __future__ import annotations

import re
from pathlib import Path

from agent_sandbox.surfaces.cli import deploy_files as files

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
WHEEL = "abx_sandbox-9.9.9-py3-none-any.whl"


def settings(**kw: object) -> files.Settings:
    base: dict = {"token": "t" * 40, "api_key": "sk-x", "base_url": None, "region": None,
                  "template": "base", "package": WHEEL, "wheel": WHEEL,
                  "package_note": f"{WHEEL} (abx-sandbox 9.9.9 built from /src, git abc)"}
    return files.Settings(**{**base, **kw})  # type: ignore[arg-type]


def apt_line(dockerfile: str) -> set[str]:
    match = re.search(r"apt-get install -y --no-install-recommends \\\n\s+(.+?) \\\n",
                      dockerfile)
    assert match, dockerfile
    return set(match.group(1).split())


def setup_packages() -> set[str]:
    match = re.search(r"^packages=\((.+)\)$", SETUP.read_text(), re.M)
    assert match
    return set(match.group(1).split())


def test_engine_image_carries_what_setup_installs_for_the_engine() -> None:
    dockerfile = files.dockerfile(settings())
    # uidmap (newuidmap) is for rootless users; the container's engine runs as root.
    assert setup_packages() - {"uidmap"} <= apt_line(dockerfile)
    assert set(files.ENGINE_PACKAGES) <= apt_line(dockerfile)
    assert "privileged" in dockerfile and "embedded engine" in dockerfile
    assert f"COPY {WHEEL} /tmp/{WHEEL}" in dockerfile
    assert f'pip install --no-cache-dir "/tmp/{WHEEL}"' in dockerfile
    assert "built from /src, git abc" in dockerfile
    assert "agent-sandbox\n" not in dockerfile and "pip install agent-sandbox" not in dockerfile


def test_gateway_client_image_has_no_engine_and_says_so() -> None:
    dockerfile = files.dockerfile(settings(base_url="https://gw.example"))
    assert not set(files.ENGINE_PACKAGES) & apt_line(dockerfile)
    assert "gateway client" in dockerfile and "https://gw.example" in dockerfile
    assert "privileged" not in dockerfile
    step = files.docker_steps("/out", settings(base_url="https://gw.example"))[0]
    assert "gateway client" in step and WHEEL in step


def test_a_pip_requirement_instead_of_the_wheel() -> None:
    s = settings(package="abx-sandbox==9.9.9", wheel=None, package_note="")
    dockerfile = files.dockerfile(s)
    assert "COPY" not in dockerfile and '"abx-sandbox==9.9.9"' in dockerfile
    requirements = {f.path: f.text for f in files.fc_files(s)}["code/requirements.txt"]
    assert requirements == "abx-sandbox==9.9.9\n"
    assert "abx-sandbox==9.9.9" in files.fc_steps("/out", s)[0]


def test_fc_requirements_name_the_wheel_next_to_the_files() -> None:
    fc = {f.path: f for f in files.fc_files(settings(base_url="https://gw.example"))}
    # The printed step runs pip in the output dir, where the wheel is.
    assert fc["code/requirements.txt"].text == f"./{WHEEL}\n"
    assert "*.whl" in fc[".gitignore"].text
    steps = files.fc_steps("/out", settings(base_url="https://gw.example"))
    assert steps[1].startswith("cd /out && pip install --target code/python -r "
                               "code/requirements.txt")
    assert "built from /src" in steps[0]


def test_the_wheel_reaches_the_docker_build_context() -> None:
    docker = {f.path: f.text for f in files.docker_files(settings())}
    assert WHEEL not in docker[".dockerignore"] and "*.whl" not in docker[".dockerignore"]
    assert "abx-mcp.env" in docker[".dockerignore"]
