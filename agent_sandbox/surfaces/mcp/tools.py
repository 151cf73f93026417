"""The tools: transport-independent implementations over the SDK, and the catalogue.

Each tool takes a ``CallContext`` (session, settings, progress sink) and its arguments, and
returns a ``ToolOutput``: text for the model plus the same facts as structured data. Failures
are raised as ``SandboxError``; the server turns them into ``isError`` results. Each tool's
arguments are one model in ``tool_args`` (its input schema and its check; ``ToolSpec.call``
checks them before the handler runs). The file tools live in ``file_tools``, the shared
pieces in ``toolkit``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError, WrongStateError
from agent_sandbox.core.models import Result
from agent_sandbox.core.network import compact
from agent_sandbox.sdk import AsyncSandbox
from agent_sandbox.sdk.async_sandbox import AsyncCommandHandle
from agent_sandbox.surfaces.mcp.file_tools import (
    LIST_FILES,
    LOCK_FILE,
    READ_FILE,
    UNLOCK_FILE,
    WRITE_FILE,
)
from agent_sandbox.surfaces.mcp.output import cut
from agent_sandbox.surfaces.mcp.tool_args import (
    CreateSandboxArgs,
    ExposePortArgs,
    KillSandboxArgs,
    ListSandboxesArgs,
    ListTemplatesArgs,
    ProcessArgs,
    RunCodeArgs,
    RunCommandArgs,
    SandboxArgs,
    SetNetworkArgs,
    SnapshotSandboxArgs,
)
from agent_sandbox.surfaces.mcp.toolkit import (
    CallContext,
    ToolOutput,
    ToolSpec,
    built_templates,
    check_network,
    default_template,
    describe,
    existing_sandbox,
    fit_streams,
    public_info,
    sandbox_for,
)

__all__ = ["ALL_TOOLS", "PRESETS", "CallContext", "ToolOutput", "ToolSpec", "resolve_allowlist"]


# ---- lifecycle ----------------------------------------------------------------------------

async def create_sandbox(ctx: CallContext, a: CreateSandboxArgs) -> ToolOutput:
    persistent = a.persistent
    check_network(ctx, a.network)
    options = a.model_dump(exclude={"template"})
    options["network"] = compact(a.network)
    sb = await AsyncSandbox.create(
        template=await default_template(ctx) if a.template is None else a.template,
        metadata={"mcp_session": ctx.session.session_id[:64]}, **options)
    was_default = ctx.session.default_id is None
    ctx.session.adopt(sb, persistent=persistent)
    ctx.sandbox_id = sb.sandbox_id
    info = await sb.info()
    note = " It is now this session's default sandbox." if was_default else ""
    return ToolOutput(f"Created sandbox {describe(info)}.{note}",
                      {"sandbox": public_info(info), "default": was_default})


async def list_templates(ctx: CallContext, a: ListTemplatesArgs) -> ToolOutput:
    default = await default_template(ctx)
    found = sorted(await built_templates(), key=lambda t: (t.name != default, t.name))
    rows: list[dict[str, Any]] = []
    lines = []
    for t in found:
        row = {"name": t.name, "kind": t.kind, "description": t.description,
               "has_kernel": t.has_kernel, "workdir": t.workdir, "default": t.name == default}
        if t.kind == "recipe":
            row.update(parent=t.parent, layers=t.layers, size_bytes=t.size_bytes)
        if t.created_at:
            row["created_at"] = t.created_at
        rows.append(row)
        flags = [t.kind, *(["run_code works"] if t.has_kernel else []),
                 *([f"built on {t.parent}"] if t.parent else []),
                 *(["the default"] if t.name == default else [])]
        lines.append(f"{t.name} ({', '.join(flags)})" + (f": {t.description}"
                                                         if t.description else ""))
    return ToolOutput("Templates (create_sandbox template=NAME):\n" + "\n".join(lines),
                      {"templates": rows})


async def list_sandboxes(ctx: CallContext, a: ListSandboxesArgs) -> ToolOutput:
    infos = await AsyncSandbox.list(template=a.template, state=a.state)
    mine = [i for i in infos if ctx.session.may_see(i.sandbox_id, i.persistent)]
    default = ctx.session.default_id
    lines = [("* " if i.sandbox_id == default else "  ") + describe(i) for i in mine]
    text = "\n".join(lines) if lines else "No sandboxes yet; create_sandbox makes one (or just " \
        "run a command: a default sandbox is created on first use)."
    return ToolOutput(text, {"sandboxes": [public_info(i) for i in mine], "default": default})


async def set_network(ctx: CallContext, a: SetNetworkArgs) -> ToolOutput:
    check_network(ctx, a.network)
    sb = await existing_sandbox(ctx, a.sandbox_id)
    await sb.set_network(a.network)
    info = await sb.info()
    return ToolOutput(f"Network of {sb.sandbox_id} is now {a.network.describe()}; sandbox "
                      f"{describe(info)}.", {"sandbox": public_info(info)})


async def expose_port(ctx: CallContext, a: ExposePortArgs) -> ToolOutput:
    sb = await existing_sandbox(ctx, a.sandbox_id)
    url = await sb.expose_port(a.port)
    try:  # a gateway's share link: what a person's browser can open (docs/ports.md)
        link: str | None = await sb.expose_port(a.port, public=False)
    except InvalidArgumentError:  # this host's engine: its URL opens only here
        link = None
    where = (f"{url} (API clients) and, for a person's browser, {link} (a share link that "
             "expires)" if link else f"{url} (from the machine this server runs on)")
    return ToolOutput(f"Port {a.port} of {sb.sandbox_id} is reachable at {where}.",
                      {"sandbox_id": sb.sandbox_id, "port": a.port, "url": url,
                       **({"share_url": link} if link else {})})


async def _lifecycle(ctx: CallContext, a: SandboxArgs, spec: ToolSpec, verb: str) -> ToolOutput:
    sb = await existing_sandbox(ctx, a.sandbox_id)
    await getattr(sb, verb)()
    info = await sb.info()
    return ToolOutput(f"{spec.name}: done; sandbox {describe(info)}.",
                      {"sandbox": public_info(info)})


async def pause_sandbox(ctx: CallContext, a: SandboxArgs) -> ToolOutput:
    return await _lifecycle(ctx, a, PAUSE_SANDBOX, "pause")


async def resume_sandbox(ctx: CallContext, a: SandboxArgs) -> ToolOutput:
    return await _lifecycle(ctx, a, RESUME_SANDBOX, "resume")


async def reset_rootfs(ctx: CallContext, a: SandboxArgs) -> ToolOutput:
    return await _lifecycle(ctx, a, RESET_ROOTFS, "reset_rootfs")


async def snapshot_sandbox(ctx: CallContext, a: SnapshotSandboxArgs) -> ToolOutput:
    sb = await existing_sandbox(ctx, a.sandbox_id)
    snap = await sb.snapshot(a.name)
    return ToolOutput(f"Snapshot {snap.snapshot_id} of {sb.sandbox_id} taken "
                      f"({snap.size_bytes >> 20} MiB); create_sandbox with snapshot="
                      f"{snap.snapshot_id} starts a copy of it (processes, memory, files).",
                      {"snapshot": snap.model_dump()})


async def kill_sandbox(ctx: CallContext, a: KillSandboxArgs) -> ToolOutput:
    delete = a.delete_volumes
    sb = await existing_sandbox(ctx, a.sandbox_id)
    await sb.kill(delete_volume=delete)
    ctx.session.forget(sb.sandbox_id)
    kept = "" if delete else " Its /workspace volume was kept."
    return ToolOutput(f"Killed sandbox {sb.sandbox_id}.{kept}",
                      {"sandbox_id": sb.sandbox_id, "killed": True, "volume_deleted": delete})


# ---- code and commands --------------------------------------------------------------------

_IMAGE_FORMATS = (("png", "image/png"), ("jpeg", "image/jpeg"))


async def run_code(ctx: CallContext, a: RunCodeArgs) -> ToolOutput:
    code, language, timeout, context = a.code, a.language, a.timeout, a.context
    sb = await sandbox_for(ctx, a.sandbox_id, needs_kernel=True)
    sink = ctx.progress
    on_out = (lambda t: sink("stdout", t)) if sink else None
    on_err = (lambda t: sink("stderr", t)) if sink else None
    started = time.monotonic()
    try:
        ex = await sb.run_code(code, language=language, timeout=timeout, context=context,
                               on_stdout=on_out, on_stderr=on_err)
    except WrongStateError as exc:  # no kernel in this sandbox's template
        raise WrongStateError(exc.message + "; or use run_command with python3 -c '...'",
                              details={"alternative": "run_command"}) from None
    took = round((time.monotonic() - started) * 1000, 1)
    streams, saved = await fit_streams(sb, ctx, {"stdout": ex.stdout, "stderr": ex.stderr})
    budget = ctx.config.output_budget
    images: list[tuple[str, str]] = []
    results: list[dict[str, Any]] = []
    parts = [f"[{ex.execution_count}] context {ex.context_id}" if ex.execution_count
             else f"context {ex.context_id}"]
    if ex.kernel_restarted:
        parts.append("note: the kernel had died and was restarted: earlier variables are lost")
    if ex.truncated:
        parts.append("note: the cell produced more output than is kept (32 MiB); the rest "
                     "was dropped: write big output to a file instead")
    for name, text in streams.items():
        if text:
            parts.append(f"--- {name} ---\n{text.rstrip()}")
    for res in ex.results:
        item: dict[str, Any] = {"is_main_result": res.is_main_result, "formats": res.formats()}
        for fmt in ("text", "html", "markdown", "svg", "latex"):
            value = getattr(res, fmt)
            if value is not None:
                item[fmt] = cut(value, budget // 4, None)
        left_out = json_formats(res, budget // 4, item)
        attached = []
        for fmt, mime in _IMAGE_FORMATS:
            value = getattr(res, fmt)
            if value:
                images.append((value, mime))
                attached.append(f"image #{len(images)}")
                item[fmt] = f"(attached as image #{len(images)})"
        results.append(item)
        label = "result" if res.is_main_result else "display"
        shown = item.get("text") or ", ".join(res.formats())
        parts.append(f"--- {label} ---\n{shown}" + (f" [{', '.join(attached)} attached]"
                                                     if attached else "")
                     + _chart_line(res.chart) + "".join(f"\n({note})" for note in left_out))
    if ex.error:
        trace = ex.error.traceback
        trace = cut(trace, budget // 4, None)
        parts.append(f"--- error ---\n{ex.error.name}: {ex.error.value}"
                     + (f"\n{trace}" if trace else ""))
    if len(parts) == 1:
        parts.append("(no output)")
    data = {"sandbox_id": sb.sandbox_id, "context": ex.context_id,
            "execution_count": ex.execution_count, **streams, "results": results,
            "error": ex.error.model_dump() if ex.error else None,
            "kernel_restarted": ex.kernel_restarted, "truncated": bool(saved) or ex.truncated,
            "full_output": saved, "duration_ms": took}
    return ToolOutput("\n".join(parts), data, images)


def json_formats(res: Result, keep: int, item: dict[str, Any]) -> list[str]:
    """The JSON formats the sandbox made (a display's ``json``, a DataFrame's ``data``, a
    figure's ``chart``) into ``item`` as they are, each if its JSON is at most ``keep``
    characters; a note for each left out."""
    notes = []
    for fmt, value in (("json", res.json), ("data", res.data), ("chart", res.chart)):
        if value is None:
            continue
        size = len(json.dumps(value))
        if size <= keep:
            item[fmt] = value
        else:
            notes.append(f"{fmt}: {size} bytes of JSON, over the output budget, left out")
    return notes


def _chart_line(chart: dict[str, Any] | None) -> str:
    """A chart's kind, title and element count, for the model to read (the sandbox's
    JSON: only strings and a list's length are taken from it, cut short)."""
    if not chart:
        return ""
    kind, title, elements = chart.get("type"), chart.get("title"), chart.get("elements")
    line = f"\nchart: {kind[:40] if isinstance(kind, str) else 'unknown'}"
    if isinstance(title, str) and title:
        line += f" {title[:200]!r}"
    if isinstance(elements, list):
        line += f", {len(elements)} element{'s' if len(elements) != 1 else ''}"
    return line


def _command_text(exit_code: int | None, streams: dict[str, str], extra: str = "") -> str:
    parts = [f"exit code: {exit_code}" if exit_code is not None else "still running"]
    if extra:
        parts.append(extra)
    for name, text in streams.items():
        if text:
            parts.append(f"--- {name} ---\n{text.rstrip()}")
    if not any(streams.values()):
        parts.append("(no output)")
    return "\n".join(parts)


async def run_command(ctx: CallContext, a: RunCommandArgs) -> ToolOutput:
    command, workdir, envs, timeout = a.command, a.workdir, a.envs, a.timeout
    sb = await sandbox_for(ctx, a.sandbox_id)
    if a.background:
        handle = await sb.commands.run(command, cwd=workdir, envs=envs, background=True)
        assert isinstance(handle, AsyncCommandHandle)
        return ToolOutput(
            f"Started in the background as pid {handle.pid} in sandbox {sb.sandbox_id}. "
            "Use process_output to see its output and kill_process to stop it.",
            {"sandbox_id": sb.sandbox_id, "pid": handle.pid, "background": True})
    sink = ctx.progress
    on_out = (lambda t: sink("stdout", t)) if sink else None
    on_err = (lambda t: sink("stderr", t)) if sink else None
    started = time.monotonic()
    result = await sb.commands.run(command, cwd=workdir, envs=envs, timeout=timeout,
                                   on_stdout=on_out, on_stderr=on_err)
    assert not isinstance(result, AsyncCommandHandle)
    took = round((time.monotonic() - started) * 1000, 1)
    streams, saved = await fit_streams(sb, ctx, {"stdout": result.stdout,
                                                  "stderr": result.stderr})
    extra = f"timed out after {timeout:g} s and was killed" if result.timed_out else ""
    data = {"sandbox_id": sb.sandbox_id, "exit_code": result.exit_code, **streams,
            "timed_out": result.timed_out, "truncated": result.truncated or bool(saved),
            "full_output": saved, "duration_ms": took}
    return ToolOutput(_command_text(result.exit_code, streams, extra), data)


async def process_output(ctx: CallContext, a: ProcessArgs) -> ToolOutput:
    pid = a.pid
    sb = await sandbox_for(ctx, a.sandbox_id)
    out = await AsyncCommandHandle(sb._provider, sb.sandbox_id, pid).output()
    streams, saved = await fit_streams(sb, ctx, {"stdout": out.stdout, "stderr": out.stderr})
    data = {"sandbox_id": sb.sandbox_id, "pid": pid, "running": out.running,
            "exit_code": out.exit_code, **streams, "truncated": out.truncated or bool(saved),
            "full_output": saved}
    return ToolOutput(_command_text(None if out.running else out.exit_code, streams), data)


async def kill_process(ctx: CallContext, a: ProcessArgs) -> ToolOutput:
    pid = a.pid
    sb = await sandbox_for(ctx, a.sandbox_id)
    killed = await sb.commands.kill(pid)
    text = f"Killed pid {pid}." if killed else f"pid {pid} had already ended."
    return ToolOutput(text, {"sandbox_id": sb.sandbox_id, "pid": pid, "killed": killed})

# ---- the catalogue ------------------------------------------------------------------------

CREATE_SANDBOX = ToolSpec(
    "create_sandbox",
    "Create a new isolated Linux sandbox (a container with a /workspace directory). The first "
    "sandbox a session creates becomes its default, used by every tool called without "
    "sandbox_id; you rarely need this tool, since the default sandbox is created on first use. "
    "Use it for a second sandbox, a different template (list_templates shows them, "
    "those built from recipes included), network access, or one that must "
    "outlive this session (persistent). Returns the sandbox id and its settings. Network: "
    "sandboxes have none by default ('off': loopback only, so pip/npm/apt cannot download). "
    "network='registries' lets pip, npm and apt reach their package registries; a "
    "comma-separated list of host names, *.wildcards and CIDRs allows just those; 'full' "
    "allows any public address. The host, the LAN and cloud metadata are never reachable. "
    "This server's operator allows at most {network_ceiling}: asking for more is refused "
    "(only the operator can raise that ceiling). set_network changes it later.",
    CreateSandboxArgs, create_sandbox)

SET_NETWORK = ToolSpec(
    "set_network",
    "Change a sandbox's outbound network policy while it runs, without restarting it "
    "(without sandbox_id: the session's default sandbox; this never creates one). network: "
    "'off' (loopback only), 'registries' (PyPI, npm, Debian/Ubuntu apt), comma-separated "
    "host names, *.wildcards and CIDRs, or 'full'. Open connections are closed. The host, "
    "the LAN and cloud metadata are never reachable. This "
    "server's operator allows at most {network_ceiling}: asking for more is refused (only "
    "the operator can raise that ceiling).",
    SetNetworkArgs, set_network)

LIST_SANDBOXES = ToolSpec(
    "list_sandboxes",
    "List the sandboxes this session can use (the ones it created plus persistent ones), "
    "with state (running/paused) and template. The default sandbox is marked with '*'.",
    ListSandboxesArgs, list_sandboxes, read_only=True)

LIST_TEMPLATES = ToolSpec(
    "list_templates",
    "List the templates sandboxes can be created from (create_sandbox template=NAME): each "
    "with its kind, description, whether run_code works in it (a kernel), the template a "
    "recipe-built one was built on, and which is the default.",
    ListTemplatesArgs, list_templates, read_only=True)

RUN_CODE = ToolSpec(
    "run_code",
    "Run code in a stateful interpreter (a Jupyter kernel, like a notebook cell): Python by "
    "default; language javascript, typescript (Deno), bash or r runs in that language's own "
    "kernel. Variables, "
    "imports and functions persist between calls. Returns stdout/stderr, the value of the last "
    "expression, rich displays, and an error with its traceback if the code raised. "
    "matplotlib figures come back as PNG images, with their data as a chart (type, title, "
    "labels, points, bars...); a pandas DataFrame also as data (its columns). numpy, pandas "
    "and matplotlib are installed; "
    "pip install more with run_command (they vanish on reset_rootfs). A cell running past "
    "timeout is interrupted, keeping the variables. Needs a sandbox whose template has a "
    "kernel (code-interpreter-v1).",
    RunCodeArgs, run_code)

RUN_COMMAND = ToolSpec(
    "run_command",
    "Run a shell command (through sh -c) inside a sandbox and wait for it: returns the exit "
    "code, stdout and stderr. Pipes, redirections and && work. Use background=true for servers "
    "or long jobs: it returns a pid at once; then use process_output / kill_process. Long "
    "output is cut to a budget; the whole of it is saved to a file in the sandbox whose path "
    "the result names. If the client asked for progress, output is streamed as progress "
    "notifications while the command runs.",
    RunCommandArgs, run_command)

PROCESS_OUTPUT = ToolSpec(
    "process_output",
    "Show what a background command (started with run_command background=true) has printed "
    "so far, and whether it is still running (with its exit code once it ended).",
    ProcessArgs, process_output, read_only=True)

KILL_PROCESS = ToolSpec(
    "kill_process",
    "Stop a background command by pid (SIGKILL).",
    ProcessArgs, kill_process, destructive=True)

PAUSE_SANDBOX = ToolSpec(
    "pause_sandbox",
    "Pause a sandbox to free CPU and memory: its processes and their memory (variables of "
    "run_code, servers, open loopback connections) are kept on disk where the host supports "
    "it (else frozen in memory), its files always. It resumes on resume_sandbox or on its "
    "next use, where it left off. Without sandbox_id: the session's default sandbox.",
    SandboxArgs, pause_sandbox)

SNAPSHOT_SANDBOX = ToolSpec(
    "snapshot_sandbox",
    "Snapshot a sandbox: its processes, memory and files now (it keeps running). "
    "create_sandbox with snapshot=<id> then starts any number of copies of it, e.g. to try "
    "several things from the same state. Connections to the outside are reset in copies. "
    "Without sandbox_id: the session's default sandbox.",
    SnapshotSandboxArgs, snapshot_sandbox)

RESUME_SANDBOX = ToolSpec(
    "resume_sandbox",
    "Resume a paused sandbox (without sandbox_id: the session's default sandbox).",
    SandboxArgs, resume_sandbox)

RESET_ROOTFS = ToolSpec(
    "reset_rootfs",
    "Wipe every change outside /workspace (installed packages, edits under /etc...), keeping "
    "/workspace. Running processes are stopped. Without sandbox_id: the session's default "
    "sandbox.",
    SandboxArgs, reset_rootfs, destructive=True)

KILL_SANDBOX = ToolSpec(
    "kill_sandbox",
    "Destroy a sandbox (without sandbox_id: the session's default sandbox; the next tool "
    "call then makes a new default). Its /workspace volume is kept unless "
    "delete_volumes=true.",
    KillSandboxArgs, kill_sandbox, destructive=True)

EXPOSE_PORT = ToolSpec(
    "expose_port",
    "Make a server listening inside a sandbox (a web app, an API, a WebSocket) reachable: "
    "returns a URL for it, which works even with the sandbox's network off (without "
    "sandbox_id: the session's default sandbox; this never creates one). Start the server "
    "first, e.g. run_command 'python3 -m http.server 8000' with background=true.",
    ExposePortArgs, expose_port)

ALL_TOOLS: tuple[ToolSpec, ...] = (
    CREATE_SANDBOX, LIST_SANDBOXES, LIST_TEMPLATES, RUN_CODE, RUN_COMMAND, PROCESS_OUTPUT,
    KILL_PROCESS, READ_FILE, WRITE_FILE, LIST_FILES, SET_NETWORK, PAUSE_SANDBOX,
    RESUME_SANDBOX, RESET_ROOTFS, EXPOSE_PORT, KILL_SANDBOX, LOCK_FILE, UNLOCK_FILE,
    SNAPSHOT_SANDBOX,
)
PRESETS: dict[str, tuple[str, ...]] = {
    "read-only": ("list_sandboxes", "list_templates", "read_file", "list_files", "process_output"),
    "all": tuple(t.name for t in ALL_TOOLS),
}


def resolve_allowlist(spec: str | list[str] | tuple[str, ...] | None) -> list[ToolSpec]:
    """The tools an ``ABX_MCP_TOOLS``-style spec allows (names and presets, comma separated)."""
    if spec is None:
        return list(ALL_TOOLS)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    by_name = {t.name: t for t in ALL_TOOLS}
    wanted: set[str] = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item in PRESETS:
            wanted.update(PRESETS[item])
        elif item in by_name:
            wanted.add(item)
        else:
            raise InvalidArgumentError(
                f"unknown tool {item!r} in the allowlist; known: {', '.join(by_name)}, "
                f"presets: {', '.join(PRESETS)}")
    return [t for t in ALL_TOOLS if t.name in wanted]
