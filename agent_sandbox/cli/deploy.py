"""``abx mcp deploy``: write a ready-to-ship artifact (fc, docker, kubernetes). No cloud calls."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated

import typer

from agent_sandbox.cli import deploy_files as files
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
    package: Annotated[str, typer.Option(help="pip requirement that installs agent-sandbox "
                                         "in the artifact.")] = "agent-sandbox",
    force: Annotated[bool, typer.Option("--force", help="Overwrite files from an earlier "
                                        "deploy.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Write a deployable MCP server artifact; calls no cloud API.

    fc: a Function Compute custom-runtime code package (bootstrap serving port 9000,
    config.yaml with the key and token, mode 0600). docker: Dockerfile + compose.yaml +
    abx-mcp.env. kubernetes: Secret/Deployment/Service manifests. Always carries a
    non-empty bearer token; prints the manual steps and an IDE config with the token masked.
    """
    if target not in BUILDERS:
        raise UsageError(f"unknown --target {target!r}; choose fc, docker or kubernetes")
    token = _token(generate_token, auth_token_file)
    make, steps, url, secret_file = BUILDERS[target]
    settings = files.Settings(
        token=token, api_key=api_key or resolve("sandbox_api_key").value,
        base_url=base_url or resolve("base_url").value, region=region or resolve("region").value,
        template=template, package=package)
    out = output_dir.expanduser().resolve()
    artifact = make(settings)
    clash = [f.path for f in artifact if (out / f.path).exists()]
    if clash and not force:
        raise CliError(f"{out} already has {', '.join(clash)}; pass --force to overwrite, or "
                       "choose another --output-dir")
    for f in artifact:
        path = out / f.path
        path.parent.mkdir(mode=0o700 if f.secret else 0o755, parents=True, exist_ok=True)
        atomic_write(path, f.text.encode(), mode=f.mode, force_mode=True)
    masked = mask(token)
    result = {"target": target, "output_dir": str(out), "files": [f.path for f in artifact],
              "secret_file": str(out / secret_file), "token": masked,
              "token_generated": generate_token, "api_key": bool(settings.api_key),
              "steps": steps(str(out)), "ide_config": files.ide_template(url, masked)}
    if want_json(json_out):
        print_json(result)
        return
    console.print(f"Wrote the {target} artifact to {out}:")
    for f in artifact:
        console.print(f"  {f.path}" + ("   [b](secret, 0600)[/b]" if f.secret else ""))
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
