"""The tools: transport-independent implementations over the SDK, and the catalogue.

Each tool takes a ``CallContext`` (session, settings, progress sink) and its arguments, and
returns a ``ToolOutput``: text for the model plus the same facts as structured data. Failures
are raised as ``SandboxError``; the server turns them into ``isError`` results. Arguments
are checked against the tool's input schema (``Args``). The file tools live in
``file_tools``, the shared pieces in ``toolkit``.
"""

from __future__ import annotations

import time
from typing import Any

from agent_sandbox.agent.args import Args
from agent_sandbox.agent.file_tools import LIST_FILES, READ_FILE, WRITE_FILE
from agent_sandbox.agent.output import cut
from agent_sandbox.agent.toolkit import (
    MAX_IDLE,
    MAX_PID,
    MAX_TIMEOUT,
    PATH,
    SANDBOX_ID,
    SANDBOX_ID_REQUIRED,
    CallContext,
    ToolOutput,
    ToolSpec,
    describe,
    fit_streams,
    public_info,
    sandbox_for,
)
from agent_sandbox.errors import InvalidArgumentError, WrongStateError
from agent_sandbox.sdk import AsyncSandbox
from agent_sandbox.sdk.async_sandbox import AsyncCommandHandle

__all__ = ["ALL_TOOLS", "PRESETS", "CallContext", "ToolOutput", "ToolSpec", "resolve_allowlist"]


# ---- lifecycle ----------------------------------------------------------------------------

async def create_sandbox(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("create_sandbox", raw, CREATE_SANDBOX.properties)
    persistent = a.bool("persistent")
    sb = await AsyncSandbox.create(
        template=a.str("template", ctx.config.template),
        timeout=a.num("timeout", 300),
        envs=a.envs(),
        network=a.bool("network"),
        persistent=persistent,
        memory_mb=a.num("memory_mb"),
        cpu=a.num("cpu"),
        metadata={"mcp_session": ctx.session.session_id[:64]},
    )
    was_default = ctx.session.default_id is None
    ctx.session.adopt(sb, persistent=persistent)
    ctx.sandbox_id = sb.sandbox_id
    info = await sb.info()
    note = " It is now this session's default sandbox." if was_default else ""
    return ToolOutput(f"Created sandbox {describe(info)}.{note}",
                      {"sandbox": public_info(info), "default": was_default})


async def list_sandboxes(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("list_sandboxes", raw, LIST_SANDBOXES.properties)
    infos = await AsyncSandbox.list(template=a.str("template"), state=a.str("state"))
    mine = [i for i in infos if ctx.session.may_see(i.sandbox_id, i.persistent)]
    default = ctx.session.default_id
    lines = [("* " if i.sandbox_id == default else "  ") + describe(i) for i in mine]
    text = "\n".join(lines) if lines else "No sandboxes yet; create_sandbox makes one (or just " \
        "run a command: a default sandbox is created on first use)."
    return ToolOutput(text, {"sandboxes": [public_info(i) for i in mine], "default": default})


async def _lifecycle(ctx: CallContext, raw: dict[str, Any], spec: ToolSpec,
                     verb: str) -> ToolOutput:
    a = Args(spec.name, raw, spec.properties)
    sb = await ctx.session.resolve(a.str("sandbox_id", required=True))
    ctx.sandbox_id = sb.sandbox_id
    await getattr(sb, verb)()
    info = await sb.info()
    return ToolOutput(f"{spec.name}: done; sandbox {describe(info)}.",
                      {"sandbox": public_info(info)})


async def pause_sandbox(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    return await _lifecycle(ctx, raw, PAUSE_SANDBOX, "pause")


async def resume_sandbox(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    return await _lifecycle(ctx, raw, RESUME_SANDBOX, "resume")


async def reset_rootfs(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    return await _lifecycle(ctx, raw, RESET_ROOTFS, "reset_rootfs")


async def kill_sandbox(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("kill_sandbox", raw, KILL_SANDBOX.properties)
    sandbox_id = a.str("sandbox_id", required=True)
    delete = a.bool("delete_volumes")
    sb = await ctx.session.resolve(sandbox_id)
    ctx.sandbox_id = sb.sandbox_id
    await sb.kill(delete_volume=delete)
    ctx.session.forget(sb.sandbox_id)
    kept = "" if delete else " Its /workspace volume was kept."
    return ToolOutput(f"Killed sandbox {sb.sandbox_id}.{kept}",
                      {"sandbox_id": sb.sandbox_id, "killed": True, "volume_deleted": delete})


# ---- code and commands --------------------------------------------------------------------

_IMAGE_FORMATS = (("png", "image/png"), ("jpeg", "image/jpeg"))


async def run_code(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("run_code", raw, RUN_CODE.properties)
    code = a.str("code", required=True)
    language = a.str("language", "python")
    timeout = a.num("timeout", 60)
    context = a.str("context")
    sb = await sandbox_for(ctx, a.str("sandbox_id"), needs_kernel=True)
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
        if res.json is not None:
            item["json"] = res.json
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
                                                     if attached else ""))
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


async def run_command(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("run_command", raw, RUN_COMMAND.properties)
    command = a.str("command", required=True)
    workdir = a.str("workdir", "/workspace")
    envs = a.envs()
    timeout = a.num("timeout", 60)
    background = a.bool("background")
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
    if background:
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
    extra = f"timed out after {timeout} s and was killed" if result.timed_out else ""
    data = {"sandbox_id": sb.sandbox_id, "exit_code": result.exit_code, **streams,
            "timed_out": result.timed_out, "truncated": result.truncated or bool(saved),
            "full_output": saved, "duration_ms": took}
    return ToolOutput(_command_text(result.exit_code, streams, extra), data)


async def process_output(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("process_output", raw, PROCESS_OUTPUT.properties)
    pid = a.num("pid")
    if pid is None:
        raise InvalidArgumentError("process_output: 'pid' is required (from run_command with "
                                   "background=true)")
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
    out = await AsyncCommandHandle(sb._provider, sb.sandbox_id, pid).output()
    streams, saved = await fit_streams(sb, ctx, {"stdout": out.stdout, "stderr": out.stderr})
    data = {"sandbox_id": sb.sandbox_id, "pid": pid, "running": out.running,
            "exit_code": out.exit_code, **streams, "truncated": out.truncated or bool(saved),
            "full_output": saved}
    return ToolOutput(_command_text(None if out.running else out.exit_code, streams), data)


async def kill_process(ctx: CallContext, raw: dict[str, Any]) -> ToolOutput:
    a = Args("kill_process", raw, KILL_PROCESS.properties)
    pid = a.num("pid")
    if pid is None:
        raise InvalidArgumentError("kill_process: 'pid' is required")
    sb = await sandbox_for(ctx, a.str("sandbox_id"))
    killed = await sb.commands.kill(pid)
    text = f"Killed pid {pid}." if killed else f"pid {pid} had already ended."
    return ToolOutput(text, {"sandbox_id": sb.sandbox_id, "pid": pid, "killed": killed})

# ---- the catalogue ------------------------------------------------------------------------

CREATE_SANDBOX = ToolSpec(
    "create_sandbox",
    "Create a new isolated Linux sandbox (a container with a /workspace directory). The first "
    "sandbox a session creates becomes its default, used by every tool called without "
    "sandbox_id; you rarely need this tool, since the default sandbox is created on first use. "
    "Use it for a second sandbox, a different template, network access, or one that must "
    "outlive this session (persistent). Returns the sandbox id and its settings.",
    {"template": {"type": "string", "maxLength": 128,
                  "description": "Template name (default: the server's)."},
     "timeout": {"type": "number", "minimum": 0.001, "maximum": MAX_IDLE,
                 "description": "Idle seconds before it is auto-paused (default 300); any use "
                 "resets the clock."},
     "envs": {"type": "object", "additionalProperties": {"type": "string"},
              "description": "Environment variables for every command in it."},
     "network": {"type": "boolean", "description": "Allow outbound network (default false: "
                 "loopback only)."},
     "persistent": {"type": "boolean", "description": "Keep it after this session ends "
                    "(default false: destroyed with the session)."},
     "memory_mb": {"type": "integer", "minimum": 32, "maximum": 1 << 20,
                   "description": "Memory limit in MiB."},
     "cpu": {"type": "number", "minimum": 0.01, "maximum": 1024,
             "description": "CPU limit in cores, e.g. 0.5."}},
    create_sandbox)

LIST_SANDBOXES = ToolSpec(
    "list_sandboxes",
    "List the sandboxes this session can use (the ones it created plus persistent ones), "
    "with state (running/paused) and template. The default sandbox is marked with '*'.",
    {"template": {"type": "string", "maxLength": 128, "description": "Only this template."},
     "state": {"type": "string", "enum": ["running", "paused"], "description": "Only this state."}},
    list_sandboxes, read_only=True)

RUN_CODE = ToolSpec(
    "run_code",
    "Run Python in a stateful interpreter (a Jupyter kernel, like a notebook cell): variables, "
    "imports and functions persist between calls. Returns stdout/stderr, the value of the last "
    "expression, rich displays, and an error with its traceback if the code raised. "
    "matplotlib figures come back as PNG images. numpy, pandas and matplotlib are installed; "
    "pip install more with run_command (they vanish on reset_rootfs). A cell running past "
    "timeout is interrupted, keeping the variables. Needs a sandbox whose template has a "
    "kernel (code-interpreter-v1).",
    {"code": {"type": "string", "description": "The Python code to run."},
     "language": {"type": "string", "maxLength": 32, "description": "Language (only python)."},
     "timeout": {"type": "number", "minimum": 0.001, "maximum": MAX_TIMEOUT,
                 "description": "Seconds before the cell is interrupted (default 60)."},
     "context": {"type": "string", "maxLength": 64, "description": "Interpreter context id "
                 "(default: the sandbox's default context)."},
     "sandbox_id": SANDBOX_ID},
    run_code, required=("code",))

RUN_COMMAND = ToolSpec(
    "run_command",
    "Run a shell command (through sh -c) inside a sandbox and wait for it: returns the exit "
    "code, stdout and stderr. Pipes, redirections and && work. Use background=true for servers "
    "or long jobs: it returns a pid at once; then use process_output / kill_process. Long "
    "output is cut to a budget; the whole of it is saved to a file in the sandbox whose path "
    "the result names. If the client asked for progress, output is streamed as progress "
    "notifications while the command runs.",
    {"command": {"type": "string", "description": "Shell command line."},
     "workdir": {**PATH, "description": "Working directory (default /workspace)."},
     "background": {"type": "boolean", "description": "Return at once with a pid (default "
                    "false)."},
     "timeout": {"type": "number", "minimum": 0.001, "maximum": MAX_TIMEOUT,
                 "description": "Seconds before a foreground command is killed (default 60)."},
     "envs": {"type": "object", "additionalProperties": {"type": "string"},
              "description": "Extra environment variables."},
     "sandbox_id": SANDBOX_ID},
    run_command, required=("command",))

PROCESS_OUTPUT = ToolSpec(
    "process_output",
    "Show what a background command (started with run_command background=true) has printed "
    "so far, and whether it is still running (with its exit code once it ended).",
    {"pid": {"type": "integer", "minimum": 1, "maximum": MAX_PID,
             "description": "The pid run_command returned."},
     "sandbox_id": SANDBOX_ID},
    process_output, required=("pid",), read_only=True)

KILL_PROCESS = ToolSpec(
    "kill_process",
    "Stop a background command by pid (SIGKILL).",
    {"pid": {"type": "integer", "minimum": 1, "maximum": MAX_PID,
             "description": "The pid run_command returned."},
     "sandbox_id": SANDBOX_ID},
    kill_process, required=("pid",), destructive=True)
PAUSE_SANDBOX = ToolSpec(
    "pause_sandbox",
    "Pause a sandbox (freeze its processes, keep its files) to free CPU and memory. It resumes "
    "on resume_sandbox or on its next use.",
    {"sandbox_id": SANDBOX_ID_REQUIRED}, pause_sandbox, required=("sandbox_id",))

RESUME_SANDBOX = ToolSpec(
    "resume_sandbox",
    "Resume a paused sandbox.",
    {"sandbox_id": SANDBOX_ID_REQUIRED}, resume_sandbox, required=("sandbox_id",))

RESET_ROOTFS = ToolSpec(
    "reset_rootfs",
    "Wipe every change outside /workspace (installed packages, edits under /etc...), keeping "
    "/workspace. Running processes are stopped.",
    {"sandbox_id": SANDBOX_ID_REQUIRED}, reset_rootfs, required=("sandbox_id",),
    destructive=True)

KILL_SANDBOX = ToolSpec(
    "kill_sandbox",
    "Destroy a sandbox. Its /workspace volume is kept unless delete_volumes=true.",
    {"sandbox_id": SANDBOX_ID_REQUIRED,
     "delete_volumes": {"type": "boolean", "description": "Also delete its /workspace volume "
                        "(default false)."}},
    kill_sandbox, required=("sandbox_id",), destructive=True)

ALL_TOOLS: tuple[ToolSpec, ...] = (
    CREATE_SANDBOX, LIST_SANDBOXES, RUN_CODE, RUN_COMMAND, PROCESS_OUTPUT, KILL_PROCESS,
    READ_FILE, WRITE_FILE, LIST_FILES, PAUSE_SANDBOX, RESUME_SANDBOX, RESET_ROOTFS, KILL_SANDBOX,
)
PRESETS: dict[str, tuple[str, ...]] = {
    "read-only": ("list_sandboxes", "read_file", "list_files", "process_output"),
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
