"""The files ``abx mcp deploy`` writes, per target. Pure functions of the settings."""

from __future__ import annotations

import json
from dataclasses import dataclass

from agent_sandbox.surfaces.cli.yamlout import dump, dump_all

PORT = 9000
APP = "agent_sandbox.surfaces.mcp.http_app:asgi_app"
NAME = "agent-sandbox-mcp"
SECRET_WARNING = ("# SECRET: holds the MCP bearer token{key}. Never commit it to version "
                  "control;\n# keep it mode 0600.\n")


# What the docker image needs to run the embedded engine (as root): the packages
# scripts/setup.sh installs for it, less uidmap (rootless users only). A test keeps them equal.
ENGINE_PACKAGES = ("runc", "e2fsprogs", "util-linux", "iproute2", "nftables")
# The distribution's python3 in /usr: the guest agent in every sandbox runs on it.
PYTHON_PACKAGES = ("python3", "python3-venv", "ca-certificates")
IMAGE_BASE = "debian:bookworm-slim"  # python3 3.11, as requires-python asks
VENV = "/opt/abx"


@dataclass
class Settings:
    token: str
    api_key: str | None
    base_url: str | None
    region: str | None
    template: str
    package: str  # what pip installs: a pip requirement, or the wheel's file name
    wheel: str | None = None  # the wheel written next to the files (in the output dir)
    package_note: str = ""  # what that is, for the printed steps


def installs(s: Settings, where: str) -> str:
    """What the artifact installs, and how the server gets its sandboxes (a printed step)."""
    what = s.package_note or f"the pip requirement {s.package}"
    how = (f"a gateway client: its sandboxes come from {s.base_url} (no engine, no privileges)"
           if s.base_url else "the embedded engine: sandboxes are runc containers in a "
           "privileged container, the engine's tools installed")
    return f"{where} installs {what} and its dependencies; the server runs as {how}"


@dataclass
class File:
    path: str
    text: str
    mode: int = 0o644
    secret: bool = False


def _warning(s: Settings) -> str:
    return SECRET_WARNING.format(key=" and the sandbox API key" if s.api_key else "")


def _server_env(s: Settings) -> dict[str, str]:
    env = {"ABX_MCP_TEMPLATE": s.template}
    if s.base_url:
        env["ABX_SANDBOX_BASE_URL"] = s.base_url
    if s.region:
        env["SANDBOX_REGION"] = s.region
    return env


def _secret_env(s: Settings) -> dict[str, str]:
    env = {"ABX_MCP_AUTH_TOKEN": s.token}
    if s.api_key:
        env["ABX_SANDBOX_API_KEY"] = s.api_key
    return env


# ---- Function Compute ---------------------------------------------------------------------

BOOTSTRAP = '''#!/usr/bin/env python3
"""Function Compute custom-runtime bootstrap (written by `abx mcp deploy --target fc`).

Serves the agent-sandbox MCP Streamable HTTP app on $FC_SERVER_PORT (default 9000).
Settings come from config.yaml next to this file; function environment variables win.
Refuses to start without a non-empty bearer token.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {"mcp_auth_token": "ABX_MCP_AUTH_TOKEN", "sandbox_api_key": "ABX_SANDBOX_API_KEY",
            "base_url": "ABX_SANDBOX_BASE_URL", "region": "SANDBOX_REGION",
            "template": "ABX_MCP_TEMPLATE"}


def load_config(path):
    """The flat `key: "value"` file abx writes (values are JSON strings, valid YAML)."""
    values = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text = line.strip()
            if not text or text.startswith("#") or ":" not in text:
                continue
            key, _, value = text.partition(":")
            value = value.strip()
            if value.startswith('"'):
                value = json.loads(value)
            elif value in ("", "null", "~"):
                value = ""
            values[key.strip()] = value
    return values


def main():
    config = load_config(os.environ.get("ABX_FC_CONFIG") or os.path.join(HERE, "config.yaml"))
    env = dict(os.environ)
    for key, name in SETTINGS.items():
        if config.get(key) and not env.get(name):
            env[name] = config[key]
    env.pop("ABX_MCP_AUTH_TOKEN_FILE", None)
    if not env.get("ABX_MCP_AUTH_TOKEN", "").strip():
        sys.exit("bootstrap: refusing to start without a bearer token "
                 "(mcp_auth_token in config.yaml, or ABX_MCP_AUTH_TOKEN)")
    vendor = os.path.join(HERE, "python")
    if os.path.isdir(vendor):
        env["PYTHONPATH"] = vendor + os.pathsep + env.get("PYTHONPATH", "")
    port = env.get("FC_SERVER_PORT") or "9000"
    host = env.get("ABX_FC_HOST") or "0.0.0.0"
    argv = [sys.executable, "-m", "uvicorn", "__APP__", "--host", host, "--port", port]
    os.execve(sys.executable, argv, env)


if __name__ == "__main__":
    main()
'''.replace("__APP__", APP)


def _requirement(s: Settings) -> str:
    return f"./{s.wheel}" if s.wheel else s.package


def fc_files(s: Settings) -> list[File]:
    config = {"mcp_auth_token": s.token, "sandbox_api_key": s.api_key or "",
              "base_url": s.base_url or "", "region": s.region or "", "template": s.template}
    lines = "".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items())
    # A path in a requirements file is relative to pip's working directory: the step below
    # runs pip in the output dir, where the wheel is.
    return [
        File("code/bootstrap", BOOTSTRAP, 0o755),
        File("code/config.yaml", _warning(s) + lines, 0o600, secret=True),
        File("code/requirements.txt", _requirement(s) + "\n"),
        File(".gitignore", "code/config.yaml\ncode/python/\n*.zip\n*.whl\n"),
    ]


def fc_steps(out: str, s: Settings) -> list[str]:
    return [
        installs(s, "The code package"),
        f"cd {out} && pip install --target code/python -r code/requirements.txt   (on Linux "
        "x86_64 with the function's Python version: pydantic-core is a binary wheel)",
        "cd code && zip -r ../function.zip . && cd ..   (the package: bootstrap at its root)",
        "In the Function Compute console (or SDK): create a function with the custom runtime "
        f"(Debian), upload function.zip, startup command ./bootstrap, listen port {PORT}",
        "Add an HTTP trigger (anonymous: the app checks the bearer token itself)",
        "Where supported, enable session affinity on the Mcp-Session-Id header (MCP sessions "
        "live in one instance)",
        "Put the trigger URL into your IDE with the config below",
    ]


# ---- Docker -------------------------------------------------------------------------------

def dockerfile(s: Settings) -> str:
    apt = [*PYTHON_PACKAGES, *(() if s.base_url else ENGINE_PACKAGES)]
    if s.base_url:
        mode = (f"# A gateway client: its sandboxes are made by the gateway at {s.base_url}\n"
                "# (ABX_SANDBOX_BASE_URL); no engine runs here, no privileges needed.\n")
    else:
        mode = ("# Runs the embedded engine: sandboxes are runc containers inside this one, so\n"
                "# it runs privileged (compose.yaml asks for it) and carries the engine's tools\n"
                f"# ({', '.join(ENGINE_PACKAGES)}); the distribution's python3\n"
                "# runs the guest agent in every sandbox.\n")
    if s.wheel:
        source = f"# Installs {s.package_note or s.wheel}.\n"
        copy = f"COPY {s.wheel} /tmp/{s.wheel}\n"
        target = f"/tmp/{s.wheel}"
    else:
        source = f"# Installs the pip requirement {s.package}.\n"
        copy = ""
        target = s.package
    return (
        f"# agent-sandbox MCP server (Streamable HTTP on port {PORT}).\n{source}{mode}"
        f"FROM {IMAGE_BASE}\n"
        "RUN apt-get update \\\n"
        "    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\\n"
        f"       {' '.join(apt)} \\\n"
        "    && rm -rf /var/lib/apt/lists/*\n"
        f"{copy}"
        f"RUN python3 -m venv {VENV} \\\n"
        f"    && {VENV}/bin/pip install --no-cache-dir {json.dumps(target)} \\\n"
        f"    && rm -f /tmp/*.whl\n"
        f"ENV PATH={VENV}/bin:$PATH ABX_MCP_AUDIT_LOG=\"\"\n"
        f"EXPOSE {PORT}\n"
        f'CMD ["python", "-m", "uvicorn", "{APP}", "--host", "0.0.0.0", "--port", "{PORT}"]\n'
    )


def docker_files(s: Settings) -> list[File]:
    service: dict[str, object] = {
        "build": ".", "image": f"{NAME}:latest", "ports": [f"{PORT}:{PORT}"],
        "env_file": ["abx-mcp.env"], "environment": _server_env(s),
        "restart": "unless-stopped",
    }
    if not s.base_url:
        # No gateway: the embedded engine runs containers itself and needs the host's powers.
        service["privileged"] = True
        service["volumes"] = ["abx-data:/var/lib/agent-sandbox"]
    compose: dict[str, object] = {"services": {NAME: service}}
    if not s.base_url:
        compose["volumes"] = {"abx-data": {}}
    env_text = _warning(s) + "".join(f"{k}={v}\n" for k, v in _secret_env(s).items())
    return [
        File("Dockerfile", dockerfile(s)),
        File("compose.yaml", dump(compose)),
        File("abx-mcp.env", env_text, 0o600, secret=True),
        File(".dockerignore", "abx-mcp.env\n.git\n"),
        File(".gitignore", "abx-mcp.env\n*.whl\n"),
    ]


def docker_steps(out: str, s: Settings) -> list[str]:
    return [installs(s, f"The image ({IMAGE_BASE})"),
            f"cd {out} && docker compose up -d --build",
            f"curl -H 'Authorization: Bearer <token>' http://127.0.0.1:{PORT}/health",
            "Put http://<HOST>:9000/mcp into your IDE with the config below"]


# ---- Kubernetes ---------------------------------------------------------------------------

def kubernetes_files(s: Settings) -> list[File]:
    labels = {"app": NAME}
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": NAME, "labels": labels}, "stringData": _secret_env(s)}
    container = {
        "name": "mcp", "image": f"{NAME}:latest",
        "args": ["python", "-m", "uvicorn", APP, "--host", "0.0.0.0", "--port", str(PORT)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "envFrom": [{"secretRef": {"name": NAME}}],
        "env": [{"name": k, "value": v} for k, v in _server_env(s).items()],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 20},
    }
    if not s.base_url:
        container["securityContext"] = {"privileged": True}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "labels": labels},
        # MCP sessions live in one process: a single replica (or sticky routing).
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "labels": labels},
        "spec": {"selector": labels, "sessionAffinity": "ClientIP",
                 "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }
    return [
        File("secret.yaml", _warning(s) + dump(secret), 0o600, secret=True),
        File("deployment.yaml", dump(deployment)),
        File("service.yaml", dump(service)),
        File("kustomization.yaml", dump({"resources": ["secret.yaml", "deployment.yaml",
                                                       "service.yaml"]})),
        File(".gitignore", "secret.yaml\n"),
    ]


def kubernetes_steps(out: str, s: Settings) -> list[str]:
    same = f" --base-url {s.base_url}" if s.base_url else ""
    return [f"Build and push the image ({NAME}:latest; `abx mcp deploy --target docker{same}` "
            "writes its Dockerfile and wheel), and set it in deployment.yaml",
            f"kubectl apply -k {out}",
            f"kubectl port-forward svc/{NAME} {PORT}:{PORT}   (or expose it via an Ingress)",
            "Put the service URL + /mcp into your IDE with the config below"]


def ide_template(url: str, masked_token: str) -> str:
    return json.dumps({"mcpServers": {"agent-sandbox-remote": {
        "url": url, "headers": {"Authorization": f"Bearer {masked_token}"}}}}, indent=2)


__all__ = ["File", "Settings", "dump_all"]
