"""``abx template``: the root filesystems sandboxes start from, on the engine `abx sandbox`
uses (listing works through a daemon or gateway too; building and removing need the engine
in this process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent_sandbox.core.templates import CODE_INTERPRETER
from agent_sandbox.surfaces.cli.output import CliError, console, err_console, print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import parse_pairs, provider, template_engine
from agent_sandbox.surfaces.cli.template_push import push
from agent_sandbox.surfaces.cli.template_recipe import build_recipe, prune

app = typer.Typer(help="Templates: list, build (import a directory or image archive), push "
                       "(as an image for Kubernetes), remove.", no_args_is_help=True)
app.command(epilog="Example: abx template prune")(prune)
app.command(epilog="Examples:\n\n  sudo abx template push base --load-lab\n\n"
                   "  abx template push mytools --image registry.example.com/abx/mytools:v1 "
                   "--output mytools.tar")(push)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command("ls", hidden=True)
@app.command("list", epilog="Example: abx template list --json")
def list_(json_out: JsonOpt = False) -> None:
    """List the templates `abx sandbox create` can use (this host's engine, the daemon's
    or the gateway's)."""
    templates = provider().list_templates()
    if want_json(json_out):
        print_json([t.model_dump() for t in templates])
        return
    table = Table("name", "kind", "parent", "layers", "size", "workdir", "created",
                  "description")
    for t in templates:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.created_at)) \
            if t.created_at else "-"
        size = f"{t.size_bytes / (1 << 20):.1f} MiB" if t.layers else "-"
        table.add_row(t.name, t.kind, t.parent or "-", str(t.layers or "-"), size, t.workdir,
                      created, t.description or "")
    console.print(table)


@app.command(epilog="Examples:\n\n  abx template build mytools --file Dockerfile --context .\n\n"
                    "  abx template build mytools ./rootfs-dir\n\n"
                    "  abx template build py312 ./python-3.12.tar --env LANG=C.UTF-8\n\n"
                    "  sudo abx template build code-interpreter-v1 --index-url "
                    "https://pypi.org/simple")
def build(
    name: Annotated[str, typer.Argument(help="Template name.")],
    source: Annotated[Path | None, typer.Argument(
        help="A root filesystem directory, or an OCI / `docker save` image archive "
             "(none for code-interpreter-v1, built from the package index).")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite an existing template "
                                          "(refused while sandboxes use it).")] = False,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, "
                                                  "repeatable.")] = None,
    workdir: Annotated[str | None, typer.Option(help="Default working directory.")] = None,
    description: Annotated[str | None, typer.Option(help="One line about it.")] = None,
    index_url: Annotated[str | None, typer.Option(
        "--index-url", help="code-interpreter-v1: the package index to build from (default: "
                            "ABX_TEMPLATE_INDEX_URL, else pip's configuration, else PyPI).")
    ] = None,
    recipe: Annotated[Path | None, typer.Option(
        "--file", "-f", help="A recipe (Dockerfile): FROM, RUN, COPY/ADD, ENV, WORKDIR, USER, "
                             "ARG, LABEL, CMD/ENTRYPOINT, HEALTHCHECK CMD.")] = None,
    context: Annotated[Path | None, typer.Option(
        help="The directory COPY reads from (default: the recipe's directory).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Build a template from a recipe (a Dockerfile, a cached layer per step, each RUN in
    a sandbox), by importing a directory or an image archive (with a progress bar), or
    build code-interpreter-v1 (as root: once, for every user of the host)."""
    if recipe is not None:
        if source is not None or index_url is not None or env or workdir:
            raise CliError("--file builds from the recipe alone: give ENV and WORKDIR in it, "
                           "and no source argument", 2)
        build_recipe(name, recipe, context, want_json(json_out))
        return
    if source is None and name == CODE_INTERPRETER:
        _build_code_template(replace, index_url, want_json(json_out))
        return
    if index_url is not None:
        raise CliError(f"--index-url is for {CODE_INTERPRETER}, which is built from the "
                       "package index; other templates come from a directory or an archive", 2)
    if source is None:
        raise CliError(f"give {name}'s source: a root filesystem directory or an image "
                       f"archive (only {CODE_INTERPRETER} is built without one)", 2)
    if not source.exists():
        raise CliError(f"{source} does not exist; give a directory or an image archive", 2)
    engine = template_engine("build")
    kw: dict[str, Any] = {"replace": replace}
    if env:
        kw["env"] = parse_pairs(env, "--env")
    if workdir:
        kw["workdir"] = workdir
    if description:
        kw["description"] = description
    quiet = want_json(json_out)
    with Progress(TextColumn("[b]{task.description}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[msg]}"), TimeElapsedColumn(),
                  console=err_console, disable=quiet, transient=False) as bar:
        task = bar.add_task(f"importing {name}", total=None, msg="")

        def progress(done: float, total: float, msg: str) -> None:
            bar.update(task, completed=done, total=total or None, msg=msg)

        info = engine.import_template(name, str(source.resolve()), progress=progress, **kw)
        bar.update(task, completed=1, total=1, msg="done")
    if quiet:
        print_json(info.model_dump())
    else:
        console.print(f"template {info.name} ready ({info.kind}); use it with "
                      f"`abx sandbox create --template {info.name}`")


def _build_code_template(force: bool, index_url: str | None, quiet: bool) -> None:
    from agent_sandbox.core.errors import RuntimeUnavailableError

    def line(text: str) -> None:
        if not quiet:
            err_console.print(f"[{CODE_INTERPRETER}] {text}", markup=False, highlight=False)

    try:
        info, where = template_engine("build").build_template(
            CODE_INTERPRETER, index_url=index_url, force=force, progress=line)
    except RuntimeUnavailableError as exc:
        raise CliError(exc.message, 1) from None
    if quiet:
        print_json({"name": info.name, "kind": info.kind, "location": where})
    else:
        console.print(f"template {info.name} ready ({where}); use it with "
                      f"`abx sandbox create --template {info.name}`")


@app.command(epilog="Example: abx template remove mytools")
def remove(name: Annotated[str, typer.Argument(help="Template name.")]) -> None:
    """Remove a template (refused while sandboxes use it; kill them first)."""
    template_engine("remove").remove_template(name)
    console.print(f"removed template {name}")
