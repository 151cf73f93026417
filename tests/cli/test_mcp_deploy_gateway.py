"""``abx mcp deploy --target kubernetes-gateway`` as a user runs it: the files and their
modes, the wheel the image installs, the admin key masked everywhere but its own file, and
clear refusals of options that do not fit."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox import __version__

pytestmark = pytest.mark.integration

yaml = pytest.importorskip("yaml")
TARGET = "kubernetes-gateway"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_gateway_artifact_with_the_wheel(abx: Any, tmp_path: Path) -> None:
    out = tmp_path / "gw"
    r = abx("mcp", "deploy", "--target", TARGET, "-o", str(out), "--namespace", "team-a",
            timeout=600)
    token = (out / "admin-api-key").read_text().strip()
    assert token.startswith("abx_") and len(token) > 40
    assert token not in r.out + r.err and "abx_****" in r.out
    assert mode(out / "admin-api-key") == 0o600
    assert mode(out / "manifests" / "20-keys-secret.yaml") == 0o600
    wheel = f"abx_sandbox-{__version__}-py3-none-any.whl"
    assert (out / wheel).is_file()
    assert f'"/tmp/{wheel}[kubernetes]"' in (out / "Dockerfile").read_text()
    manifests = sorted(p.name for p in (out / "manifests").iterdir())
    assert manifests[0] == "00-namespace.yaml" and len(manifests) == 7
    for name in manifests:
        for doc in yaml.safe_load_all((out / "manifests" / name).read_text()):
            if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                assert doc["metadata"]["namespace"] == "team-a", (name, doc["kind"])
    assert "kubectl apply -f" in r.out and "README.md" in r.out
    assert (out / "README.md").read_text().count("kubectl -n team-a") >= 2
    # Again into the same place: only with --force, and then a new key.
    assert "--force" in abx("mcp", "deploy", "--target", TARGET, "-o", str(out), "--package",
                            "abx-sandbox==1", check=1).err
    abx("mcp", "deploy", "--target", TARGET, "-o", str(out), "--package", "abx-sandbox==1",
        "--force")
    assert (out / "admin-api-key").read_text().strip() != token


def test_json_and_options(abx: Any, tmp_path: Path) -> None:
    out = tmp_path / "gw"
    info = abx("mcp", "deploy", "--target", TARGET, "-o", str(out), "--package",
               "abx-sandbox==0.1.0", "--no-create-namespace", "--hostpath-dir",
               "/var/lib/abx-vols/", "--image", "reg.example/abx/gw:1",
               "--image-pull-policy", "Never", "--storage-class", "fast",
               "--runtime-class", "gvisor", "--json").json()
    assert info["token"] == "abx_****" and info["admin_key_id"].startswith("key-")
    assert info["cluster_roles"] == ["abx-gateway-agent-sandbox-nodes",
                                     "abx-gateway-agent-sandbox-volumes"]
    assert "manifests/00-namespace.yaml" not in info["files"]
    assert info["package"]["wheel"] is None
    dep = yaml.safe_load((out / "manifests" / "40-deployment.yaml").read_text())
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg.example/abx/gw:1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ABX_K8S_HOSTPATH_DIR"] == "/var/lib/abx-vols"
    assert env["ABX_K8S_STORAGE_CLASS"] == "fast"
    claim = yaml.safe_load((out / "manifests" / "30-data-claim.yaml").read_text())
    assert claim["spec"]["storageClassName"] == "fast"
    assert '"abx-sandbox[kubernetes]==0.1.0"' in (out / "Dockerfile").read_text()


@pytest.mark.parametrize(("args", "said"), [
    (["--namespace", "Team_A"], "--namespace 'Team_A'"),
    (["--image-pull-policy", "sometimes"], "choose Always, IfNotPresent, Never"),
    (["--hostpath-dir", "relative/dir"], "absolute directory"),
    (["--hostpath-dir", "/"], "absolute directory"),
    (["--storage-class", "Fast Disks"], "not a Kubernetes object name"),
    (["--image", "a b"], "image reference"),
    (["--generate-token"], "--generate-token is for the MCP server targets"),
    (["--api-key", "k", "--base-url", "http://x"], "--api-key, --base-url is for the MCP"),
    (["--package", "git+https://example.com/x.git"], "requirement by name"),
])
def test_bad_options_are_refused(abx: Any, tmp_path: Path, args: list[str], said: str) -> None:
    out = tmp_path / "gw"
    r = abx("mcp", "deploy", "--target", TARGET, "-o", str(out), *args, check=2)
    assert said in r.err and "Traceback" not in r.err and not out.exists()


def test_gateway_options_are_refused_for_other_targets(abx: Any, tmp_path: Path) -> None:
    r = abx("mcp", "deploy", "--target", "kubernetes", "--generate-token", "-o",
            str(tmp_path / "k"), "--namespace", "x", "--hostpath-dir", "/v", check=2)
    assert "--namespace, --hostpath-dir is for --target kubernetes-gateway" in r.err
    r = abx("mcp", "deploy", "--target", "nope", "-o", str(tmp_path / "k"), check=2)
    assert "kubernetes-gateway" in r.err
