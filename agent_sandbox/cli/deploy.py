"""``abx mcp deploy``: write a ready-to-ship artifact (fc, docker, kubernetes). No cloud calls."""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from agent_sandbox.cli import deploy_files as files
from agent_sandbox.cli import wheel
from agent_sandbox.cli.atomic import atomic_write
from agent_sandbox.cli.output import (
    CliError,
    UsageError,
    console,
    err_console,
    mask,
    print_json,
    want_json,
)
from agent_sandbox.cli.settings import resolve

BUILDERS = {
    "fc": (files.fc_files, files.fc_steps, "https://<FC_HTTP_TRIGGER_URL>/mcp",
           "code/config.yaml"),
    "docker": (files.docker_files, files.docker_steps, "http://<HOST>:9000/mcp", "abx-mcp.env"),
    "kubernetes": (files.kubernetes_files, files.kubernetes_steps,
                   f"http://{files.NAME}.<NAMESPACE>.svc:9000/mcp", "secret.yaml"),
}
INSTALLS = ("fc", "docker")  # the targets whose files pip-install the package


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
        help="What the artifact installs (fc, docker): a wheel file, or a pip requirement "
             "(e.g. abx-sandbox==0.1.0 from your index). Default: a wheel built from this "
             "checkout, written into the output dir.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files from an earlier "
                                        "deploy.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Write a deployable MCP server artifact; calls no cloud API.

    fc: a Function Compute custom-runtime code package (bootstrap serving port 9000,
    config.yaml with the key and token, mode 0600). docker: Dockerfile + compose.yaml +
    abx-mcp.env (without --base-url the image carries the engine: runc, e2fsprogs,
    nftables..., and runs privileged). kubernetes: Secret/Deployment/Service manifests.
    fc and docker install abx-sandbox from a wheel built from this checkout (written next to
    the files) unless --package says otherwise. Always carries a non-empty bearer token;
    prints the manual steps and an IDE config with the token masked.
    """
    if target not in BUILDERS:
        raise UsageError(f"unknown --target {target!r}; choose fc, docker or kubernetes")
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
    for f in artifact:
        path = out / f.path
        path.parent.mkdir(mode=0o700 if f.secret else 0o755, parents=True, exist_ok=True)
        atomic_write(path, f.text.encode(), mode=f.mode, force_mode=True)
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


__all__ = ["deploy"]
