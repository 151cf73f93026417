"""``abx template push``: a local template as a container image for the Kubernetes engine
(providers/push.py), into a tar for a registry or the test cluster's nodes,
then its entry in the cluster's template catalog."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

import agent_sandbox
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.surfaces.cli.output import (
    CliError,
    UsageError,
    console,
    err_console,
    print_json,
    want_json,
)
from agent_sandbox.surfaces.cli.settings import cli_settings

LAB_SCRIPT = Path(agent_sandbox.__file__).resolve().parents[1] / "scripts" / "k8s_cluster.sh"


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


def _load_lab(path: Path) -> None:
    if not LAB_SCRIPT.is_file():
        raise CliError(f"--load-lab needs a source checkout of agent-sandbox "
                       f"({LAB_SCRIPT} is missing); use --output and load the tar yourself")
    proc = subprocess.run([str(LAB_SCRIPT), "load", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise CliError(f"loading the image into the test cluster failed "
                       f"(`{LAB_SCRIPT} load {path}`):\n{tail}")


def push(
    name: Annotated[str, typer.Argument(help="Template name (see `abx template list`).")],
    image: Annotated[str | None, typer.Option(
        "--image", help="Image reference (default abx.local/NAME:<content hash>); name your "
                        "registry's when you push the tar there.")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write the image tar here (docker-archive: `docker load`, "
                               "`skopeo copy docker-archive:FILE ...`).")] = None,
    load_lab: Annotated[bool, typer.Option(
        "--load-lab", help="Import the image into every node of the test cluster "
                           "(scripts/k8s_cluster.sh load; root).")] = False,
    catalog: Annotated[bool, typer.Option(
        "--catalog/--no-catalog", help="Write the template's entry into the cluster's "
                                       "catalog (ABX_K8S_KUBECONFIG, ABX_K8S_NAMESPACE).")
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Make a template a container image for the Kubernetes engine: the template's files
    (on a self-contained copy of base), python3 and the guest agent; then record it in the
    cluster's template catalog."""
    from agent_sandbox.core.templates import validate_name
    from agent_sandbox.providers import push as images

    quiet = want_json(json_out)
    try:
        validate_name(name)
        if image is not None:
            images.check_ref(image)
    except SandboxError as exc:
        raise UsageError(exc.message) from None
    if output is None and not load_lab:
        raise UsageError("say where the image goes: --output FILE.tar (then push it to a "
                         "registry) or --load-lab (the test cluster's nodes), or both")
    if output is not None and output.is_dir():
        raise UsageError(f"--output {output} is a directory; give a file name such as "
                         f"{output / (name + '.tar')}")
    settings = cli_settings()
    try:
        cluster = images.Catalog(settings) if catalog else None
    except SandboxError as exc:
        raise CliError(exc.message) from None
    namespace = cluster.namespace if cluster is not None else ""
    target = output if output is not None else images.scratch_path(settings, name)
    timings: dict[str, float] = {}
    try:
        with Progress(SpinnerColumn(), TextColumn("[b]{task.description}"),
                      TextColumn("{task.fields[msg]}"), TimeElapsedColumn(),
                      console=err_console, disable=quiet, transient=False) as bar:
            task = bar.add_task(f"image of {name}", total=None, msg="")

            def progress(step: str, entries: int, size: int) -> None:
                msg = f"{entries} files, {_mb(size)}" if entries else ""
                bar.update(task, description=f"{name}: {step}", msg=msg)

            t0 = time.monotonic()
            try:
                built = images.build_image(settings, name, target, ref=image,
                                           progress=progress)
            except SandboxError as exc:
                raise CliError(exc.message) from None
            except OSError as exc:
                raise CliError(f"building the image of {name} failed: {exc}") from None
            timings["build"] = time.monotonic() - t0
            bar.update(task, description=f"{name}: image {built.ref}", total=1, completed=1,
                       msg=f"{_mb(built.size)}, {built.entries} entries")
            if load_lab:
                t0 = time.monotonic()
                lab = bar.add_task("loading into the test cluster's nodes", total=None,
                                   msg="")
                _load_lab(target)
                timings["load_lab"] = time.monotonic() - t0
                bar.update(lab, msg="done", total=1, completed=1)
            if cluster is not None:
                t0 = time.monotonic()
                try:
                    cluster.put(settings, name, built.ref)
                except SandboxError as exc:
                    raise CliError(exc.message) from None
                timings["catalog"] = time.monotonic() - t0
    finally:
        if output is None:
            target.unlink(missing_ok=True)
    result = {"template": name, "image": built.ref, "size": built.size,
              "layer_size": built.layer_size, "entries": built.entries,
              "image_id": built.image_id, "output": str(output) if output else None,
              "loaded_lab": load_lab, "catalog_namespace": namespace or None,
              "seconds": {k: round(v, 2) for k, v in timings.items()}}
    if quiet:
        print_json(result)
        return
    console.print(f"image [b]{built.ref}[/b] of template {name}: {_mb(built.size)} "
                  f"({built.entries} entries), built in {timings['build']:.1f} s")
    if load_lab:
        console.print(f"loaded into the test cluster's nodes in {timings['load_lab']:.1f} s")
    if output is not None:
        console.print(f"written to {output}; push it to a registry with\n"
                      f"  skopeo copy docker-archive:{output} docker://{built.ref}\n"
                      f"or\n  docker load -i {output} && docker push {built.ref}")
        if built.ref.startswith(images.REGISTRY + "/"):
            console.print(f"({images.REGISTRY} is no registry: for one, push again with "
                          f"--image REGISTRY/{name}:TAG so the catalog names what the "
                          "nodes pull)")
    if namespace:
        console.print(f"catalog entry {name} -> {built.ref} written in namespace "
                      f"{namespace}; sandboxes use it with ABX_ENGINE=kubernetes")
    else:
        console.print("catalog not written (--no-catalog)")
