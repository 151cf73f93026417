"""``abx mcp deploy``: write a ready-to-ship artifact (fc, docker, kubernetes, and the
gateway in a cluster: kubernetes-gateway). No cloud calls."""

from __future__ import annotations

import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from agent_sandbox.providers.deploy import kubernetes_gateway as k8s
from agent_sandbox.surfaces.cli import deploy_files as files
from agent_sandbox.surfaces.cli import deploy_k8s_gateway as gw
from agent_sandbox.surfaces.cli import wheel
from agent_sandbox.surfaces.cli.atomic import atomic_write
from agent_sandbox.surfaces.cli.output import (
    CliError,
    UsageError,
    console,
    err_console,
    mask,
    print_json,
    want_json,
)
from agent_sandbox.surfaces.cli.settings import cli_settings, resolve

BUILDERS = {
    "fc": (files.fc_files, files.fc_steps, "https://<FC_HTTP_TRIGGER_URL>/mcp",
           "code/config.yaml"),
    "docker": (files.docker_files, files.docker_steps, "http://<HOST>:9000/mcp", "abx-mcp.env"),
    "kubernetes": (files.kubernetes_files, files.kubernetes_steps,
                   f"http://{files.NAME}.<NAMESPACE>.svc:9000/mcp", "secret.yaml"),
}
INSTALLS = ("fc", "docker", gw.TARGET)  # the targets whose files pip-install the package
TARGETS = "fc, docker, kubernetes or kubernetes-gateway"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class _Package:
    requirement: str  # what pip installs: a requirement, or the wheel's file name
    wheel: str | None = None  # a wheel file the artifact carries (in the output dir)
    copy_from: Path | None = None  # a wheel the user gave; None with a wheel: build it

    def provide(self, out: Path, announce: bool) -> str:
        """Put the wheel into ``out`` (built from this checkout, or copied); says what it is."""
        if self.wheel is None:
            return ""
        if self.copy_from is None:
            if announce:
                err_console.print(f"Building {self.wheel} from this checkout ...")
            built = wheel.build_wheel(out)
            return f"{built.path.name} ({built.describe()})"
        out.mkdir(mode=0o755, parents=True, exist_ok=True)
        if self.copy_from != out / self.wheel:
            shutil.copyfile(self.copy_from, out / self.wheel)
        return f"{self.wheel} (copied from {self.copy_from})"


def _package(target: str, package: str | None) -> _Package | None:
    if target not in INSTALLS:
        return None
    if package is None:
        return _Package(wheel.wheel_name(), wheel.wheel_name())
    if package.endswith(".whl"):
        path = Path(package).expanduser()
        if not path.is_file():
            raise UsageError(f"--package {package}: no such wheel file")
        return _Package(path.name, path.name, path.resolve())
    return _Package(package)


def _token(generate: bool, token_file: Path | None) -> str:
    if generate and token_file:
        raise UsageError("use --generate-token or --auth-token-file, not both")
    if generate:
        return secrets.token_urlsafe(32)
    if token_file:
        try:
            token = token_file.expanduser().read_text().strip()
        except OSError as exc:
            raise UsageError(f"--auth-token-file {token_file}: {exc.strerror}") from None
        if token:
            return token
        raise UsageError(f"--auth-token-file {token_file} is empty")
    raise UsageError("a remote MCP server must have a bearer token: add --generate-token, or "
                     "--auth-token-file FILE (e.g. `openssl rand -base64 32 > FILE`)")


def deploy(
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Where to write the "
                                             "artifact.")],
    target: Annotated[str, typer.Option("--target", "-t", help="fc (Alibaba Cloud Function "
                                        "Compute), docker or kubernetes.")] = "fc",
    generate_token: Annotated[bool, typer.Option("--generate-token", help="Make a random "
                                                 "bearer token.")] = False,
    auth_token_file: Annotated[Path | None, typer.Option("--auth-token-file", help="Use the "
                                                         "token in this file.")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", help="Sandbox API key (default: "
                                                "resolved from env, ./.env, ~/.abx).")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="Sandbox gateway the "
                                                 "server uses (default: resolved).")] = None,
    region: Annotated[str | None, typer.Option(help="Region (default: resolved).")] = None,
    template: Annotated[str, typer.Option(help="Template of the server's sandboxes.")] = "base",
    package: Annotated[str | None, typer.Option(
        help="What the artifact installs (fc, docker, kubernetes-gateway): a wheel file, or "
             "a pip requirement (e.g. abx-sandbox==0.1.0 from your index). Default: a wheel "
             "built from this checkout, written into the output dir.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files from an earlier "
                                        "deploy.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    namespace: Annotated[str | None, typer.Option(
        help="kubernetes-gateway: namespace of the gateway and its sandboxes (default "
             "agent-sandbox).")] = None,
    no_create_namespace: Annotated[bool, typer.Option(
        "--no-create-namespace", help="kubernetes-gateway: the namespace exists; write no "
        "Namespace manifest.")] = False,
    image: Annotated[str | None, typer.Option(
        help="kubernetes-gateway: the gateway image the Deployment runs (default "
             "abx-gateway:<version>; build it from the Dockerfile written).")] = None,
    image_pull_policy: Annotated[str | None, typer.Option(
        help="kubernetes-gateway: imagePullPolicy of the gateway and of sandbox Pods "
             "(Always, IfNotPresent, Never).")] = None,
    hostpath_dir: Annotated[str | None, typer.Option(
        help="kubernetes-gateway, clusters without a volume provisioner: sandbox volumes "
             "are hostPath PersistentVolumes under this node directory; adds a ClusterRole "
             "to create/delete PersistentVolumes (test clusters only).")] = None,
    storage_class: Annotated[str | None, typer.Option(
        help="kubernetes-gateway: StorageClass of the gateway's data claim and of sandbox "
             "volumes (default: the cluster's).")] = None,
    runtime_class: Annotated[str | None, typer.Option(
        help="kubernetes-gateway: runtimeClassName of sandbox Pods (gvisor, kata).")] = None,
) -> None:
    """Write a deployable MCP server artifact; calls no cloud API.

    fc: a Function Compute custom-runtime code package (bootstrap serving port 9000,
    config.yaml with the key and token, mode 0600). docker: Dockerfile + compose.yaml +
    abx-mcp.env (without --base-url the image carries the engine: runc, e2fsprogs,
    nftables..., and runs privileged). kubernetes: Secret/Deployment/Service manifests.
    kubernetes-gateway: the gateway (abx serve, ABX_ENGINE=kubernetes) inside the cluster
    whose Pods are its sandboxes: Dockerfile, RBAC limited to its namespace, Deployment,
    Service, the sandboxes' NetworkPolicy, and a first admin API key (file 0600).
    fc, docker and kubernetes-gateway install abx-sandbox from a wheel built from this
    checkout (written next to the files) unless --package says otherwise. The MCP targets
    always carry a non-empty bearer token; prints the manual steps, secrets masked.
    """
    gateway_opts = {"--namespace": namespace, "--image": image,
                    "--image-pull-policy": image_pull_policy, "--hostpath-dir": hostpath_dir,
                    "--storage-class": storage_class, "--runtime-class": runtime_class,
                    "--no-create-namespace": no_create_namespace or None}
    if target == gw.TARGET:
        mcp_opts = {"--generate-token": generate_token or None,
                    "--auth-token-file": auth_token_file, "--api-key": api_key,
                    "--base-url": base_url, "--region": region}
        _refuse(mcp_opts, "is for the MCP server targets; the gateway authenticates with "
                "API keys (this command makes the first one)")
        g = _gateway(namespace or "agent-sandbox", not no_create_namespace, image,
                     image_pull_policy, hostpath_dir, storage_class, runtime_class)
        _deploy_gateway(g, output_dir, _package(target, package), force, json_out)
        return
    if target not in BUILDERS:
        raise UsageError(f"unknown --target {target!r}; choose {TARGETS}")
    _refuse(gateway_opts, f"is for --target {gw.TARGET}")
    token = _token(generate_token, auth_token_file)
    make, steps, url, secret_file = BUILDERS[target]
    pkg = _package(target, package)
    settings = files.Settings(
        token=token, api_key=api_key or resolve("sandbox_api_key").value,
        base_url=base_url or resolve("base_url").value, region=region or resolve("region").value,
        template=template, package=pkg.requirement if pkg else "",
        wheel=pkg.wheel if pkg else None)
    out = output_dir.expanduser().resolve()
    paths = [f.path for f in make(settings)] + ([pkg.wheel] if pkg and pkg.wheel else [])
    clash = [p for p in paths if (out / p).exists()]
    if clash and not force:
        raise CliError(f"{out} already has {', '.join(clash)}; pass --force to overwrite, or "
                       "choose another --output-dir")
    if pkg:
        settings.package_note = pkg.provide(out, announce=not want_json(json_out))
    artifact = make(settings)
    _write(out, artifact)
    masked = mask(token)
    result = {"target": target, "output_dir": str(out), "files": paths,
              "secret_file": str(out / secret_file), "token": masked,
              "token_generated": generate_token, "api_key": bool(settings.api_key),
              "package": pkg and {"requirement": pkg.requirement, "wheel": pkg.wheel,
                                  "description": settings.package_note or None},
              "mode": "gateway-client" if settings.base_url else "embedded-engine",
              "steps": steps(str(out), settings), "ide_config": files.ide_template(url, masked)}
    if want_json(json_out):
        print_json(result)
        return
    console.print(f"Wrote the {target} artifact to {out}:")
    for f in artifact:
        console.print(f"  {f.path}" + ("   [b](secret, 0600)[/b]" if f.secret else ""))
    if pkg and pkg.wheel:
        console.print(f"  {settings.package_note}", markup=False)
    err_console.print(f"[yellow]WARNING[/yellow]: {secret_file} holds the bearer token"
                      + (" and the API key" if settings.api_key else "")
                      + ". Never commit it (a .gitignore excludes it).")
    if not settings.base_url and target == "fc":
        err_console.print("[yellow]note[/yellow]: no base_url: a function cannot run the "
                          "embedded engine; pass --base-url of your sandbox gateway.")
    console.print(f"Bearer token: {masked} (full value in {out / secret_file})")
    console.print("\nNext steps (manual):")
    for i, step in enumerate(result["steps"], 1):
        console.print(f"  {i}. {step}")
    console.print("\nIDE config (replace the URL; the token is masked):")
    console.print(result["ide_config"], markup=False)


def _refuse(given: dict[str, object], why: str) -> None:
    wrong = [name for name, value in given.items() if value is not None]
    if wrong:
        raise UsageError(f"{', '.join(wrong)} {why}")


def _gateway(namespace: str, create: bool, image: str | None, pull: str | None,
             hostpath: str | None, storage: str | None, runtime: str | None) -> k8s.Gateway:
    """The options of kubernetes-gateway, each checked before any file is written."""
    from agent_sandbox import __version__

    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        raise UsageError(f"--namespace {namespace!r}: a namespace is 1-63 lowercase letters, "
                         "digits and '-', starting and ending with a letter or digit")
    image = f"{k8s.NAME}:{__version__}" if image is None else image
    if not image or any(c.isspace() for c in image):
        raise UsageError(f"--image {image!r}: give an image reference such as "
                         "registry.example.com/abx/abx-gateway:0.1.0")
    if pull is not None and pull not in PULL_POLICIES:
        raise UsageError(f"--image-pull-policy {pull!r}: choose {', '.join(PULL_POLICIES)}")
    if hostpath is not None and (not hostpath.startswith("/") or hostpath.rstrip("/") == ""
                                 or any(c.isspace() for c in hostpath)):
        raise UsageError(f"--hostpath-dir {hostpath!r}: give an absolute directory of the "
                         "nodes, other than /, e.g. /var/lib/abx-volumes")
    for flag, value in (("--storage-class", storage), ("--runtime-class", runtime)):
        if value is not None and (len(value) > 253 or not _DNS_NAME.match(value)):
            raise UsageError(f"{flag} {value!r}: not a Kubernetes object name (lowercase "
                             "letters, digits, '-' and '.')")
    return k8s.Gateway(namespace=namespace, image=image, create_namespace=create,
                       pull_policy=pull or "", hostpath_dir=(hostpath or "").rstrip("/"),
                       storage_class=storage or "", runtime_class=runtime or "")


def _write(out: Path, artifact: list[files.File]) -> None:
    for f in artifact:
        path = out / f.path
        path.parent.mkdir(mode=0o700 if f.secret else 0o755, parents=True, exist_ok=True)
        atomic_write(path, f.text.encode(), mode=f.mode, force_mode=True)


def _deploy_gateway(g: k8s.Gateway, output_dir: Path, pkg: _Package | None, force: bool,
                    json_out: bool) -> None:
    assert pkg is not None
    if not pkg.wheel and gw.with_kubernetes_extra(pkg.requirement) is None:
        raise UsageError(f"--package {pkg.requirement}: give a wheel file or a requirement "
                         "by name (abx-sandbox==0.1.0): the image installs its kubernetes "
                         "extra")
    out = output_dir.expanduser().resolve()
    seed = gw.seed_keys(cli_settings())
    paths = [f.path for f in gw.gateway_files(str(out), g, seed, pkg.requirement, pkg.wheel,
                                              "")] + ([pkg.wheel] if pkg.wheel else [])
    clash = [p for p in paths if (out / p).exists()]
    if clash and not force:
        raise CliError(f"{out} already has {', '.join(clash)}; pass --force to overwrite, or "
                       "choose another --output-dir")
    note = pkg.provide(out, announce=not want_json(json_out))
    artifact = gw.gateway_files(str(out), g, seed, pkg.requirement, pkg.wheel, note)
    _write(out, artifact)
    masked = mask(seed.token)
    steps = gw.gateway_steps(str(out), g)
    roles = [d["metadata"]["name"] for d in k8s.rbac(g) if d["kind"] == "ClusterRole"]
    if want_json(json_out):
        print_json({"target": gw.TARGET, "output_dir": str(out), "files": paths,
                    "secret_file": str(out / gw.ADMIN_KEY_FILE), "token": masked,
                    "admin_key_id": seed.key_id, "namespace": g.namespace, "image": g.image,
                    "cluster_roles": roles,
                    "package": {"requirement": pkg.requirement, "wheel": pkg.wheel,
                                "description": note or None},
                    "steps": steps})
        return
    console.print(f"Wrote the {gw.TARGET} artifact to {out}:")
    for f in artifact:
        console.print(f"  {f.path}" + ("   [b](secret, 0600)[/b]" if f.secret else ""))
    if pkg.wheel:
        console.print(f"  {note}", markup=False)
    err_console.print(f"[yellow]WARNING[/yellow]: {gw.ADMIN_KEY_FILE} holds the admin API "
                      "key, the key Secret its hash. Never commit them (a .gitignore "
                      "excludes them).")
    if g.hostpath_dir:
        err_console.print("[yellow]note[/yellow]: --hostpath-dir grants the gateway "
                          "cluster-wide create/delete of PersistentVolumes (any node "
                          "directory into a Pod): for test clusters only.")
    console.print(f"Admin API key {seed.key_id}: {masked} (full value in "
                  f"{out / gw.ADMIN_KEY_FILE})")
    console.print("\nNext steps (manual; also in README.md):")
    for i, step in enumerate(steps, 1):
        console.print(f"  {i}. {step}", markup=False)


__all__ = ["deploy"]
