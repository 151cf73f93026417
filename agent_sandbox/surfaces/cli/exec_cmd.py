"""``abx sandbox exec``: a command in a sandbox as if it ran here.

- The command is everything after the sandbox id, as ``docker exec`` takes it: ``exec S
  ls -la`` needs no ``--`` (abx's own options go before the command).
- stdin that is not a terminal is passed through, streamed as it comes (``echo x | abx
  sandbox exec S cat``); ``--no-stdin`` gives the command an empty stdin instead.
- Ctrl-C, SIGTERM and SIGHUP stop the command inside (locally and through a gateway),
  then abx exits 128+signal (130 for Ctrl-C).
- The exit code is the command's as the SDK reports it: 128+N when a signal N ended it,
  124 when it ran past --timeout and was killed.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from agent_sandbox.surfaces.cli.interrupt import Interrupted, quiet_broken_pipe, run_interruptible
from agent_sandbox.surfaces.cli.output import print_json, want_json
from agent_sandbox.surfaces.cli.sdkutil import parse_pairs

_READ = 1 << 20


class ExecCommand(TyperCommand):
    """Options are recognised before the command only: from the command's first word on,
    every argument is the command's (a ``--`` is put there)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, split_command(self, args))


def split_command(command: Any, args: list[str]) -> list[str]:
    takes_value: dict[str, bool] = {"-h": False, "--help": False}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":  # typer's own click
            for opt in (*param.opts, *param.secondary_opts):
                takes_value[opt] = not (param.is_flag or param.count)
    positional = 0
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            if name in takes_value:
                i += 2 if takes_value[name] and "=" not in arg else 1
                continue
            if arg[:2] in takes_value and takes_value[arg[:2]]:  # -eNAME=VALUE
                i += 1
                continue
            if positional == 0:
                i += 1  # not ours, before the sandbox id: click says so
                continue
        else:
            positional += 1
            if positional == 1:
                i += 1
                continue
        return [*args[:i], "--", *args[i:]]
    return args


def stdin_stream(fd: int = 0) -> Iterator[bytes]:
    """What arrives on ``fd``, chunk by chunk, until its end (a pipe is never read ahead
    of what the command can take: the guest's stdin pipe pushes back)."""
    while True:
        try:
            data = os.read(fd, _READ)
        except OSError:
            return
        if not data:
            return
        yield data


def _piped_stdin() -> Iterator[bytes] | bytes | None:
    """Nothing for a terminal or /dev/null; a small file whole (one request through a
    gateway); anything else (a pipe, a big file) as a stream."""
    try:
        if os.isatty(0):
            return None
        st = os.fstat(0)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.stat(os.devnull).st_rdev:
            return None
        if stat.S_ISREG(st.st_mode) and st.st_size - os.lseek(0, 0, os.SEEK_CUR) <= _READ:
            return os.read(0, _READ + 1)
    except OSError:  # no fd 0 at all, or not seekable after all
        pass
    try:
        os.fstat(0)
    except OSError:
        return None
    return stdin_stream(0)


def _writer(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


IdArg = Annotated[str, typer.Argument(help="Sandbox id (see `abx sandbox list`).")]


def exec_(
    sandbox_id: IdArg,
    command: Annotated[list[str], typer.Argument(
        help="The command: one shell string, or words (no -- needed); abx options go "
             "before it.")],
    cwd: Annotated[str | None, typer.Option(help="Working directory inside.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=VALUE, "
                                                  "repeatable.")] = None,
    user: Annotated[str | None, typer.Option(
        "--user", "-u", help="Run as this account of the sandbox (`user`, uid 1000, exists "
                             "in every template); default root.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before it is killed (exit "
                                           "124).")] = 60,
    no_stdin: Annotated[bool, typer.Option("--no-stdin", "-n", help="Do not pass this "
                                           "stdin (a pipe or file) to the command.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Run a command in a sandbox, streaming its output and (when it is not a terminal)
    your stdin; exits with the command's exit code: 124 when it timed out, 128+N when a
    signal N ended it, 130 when Ctrl-C here stopped it."""
    from agent_sandbox.surfaces.cli.sdkutil import connect

    cmd = command[0] if len(command) == 1 else shlex.join(command)
    quiet = want_json(json_out)
    stdin = None if no_stdin else _piped_stdin()
    # Callbacks even for --json: a streamed call is one a cancel can cut.
    out = (lambda _: None) if quiet else _writer(sys.stdout)
    err = (lambda _: None) if quiet else _writer(sys.stderr)
    envs = parse_pairs(env, "--env")
    sb = connect(sandbox_id)
    try:
        result = run_interruptible(lambda: sb.commands.run(
            cmd, cwd=cwd, envs=envs, timeout=timeout, stdin=stdin, on_stdout=out,
            on_stderr=err, **({"user": user} if user else {})))
    except Interrupted as exc:
        print(f"abx: interrupted; the command in {sandbox_id} was stopped", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except BrokenPipeError:
        quiet_broken_pipe()  # `abx sandbox exec S yes | head`: the command was stopped
        raise typer.Exit(141) from None
    if quiet:
        print_json(result.model_dump())
    elif result.timed_out:
        print(f"abx: timed out after {timeout:g}s and was killed (raise --timeout)",
              file=sys.stderr)
    raise typer.Exit(result.exit_code)


EPILOG = ("Examples:\n\n  abx sandbox exec sbx-a1b2c3d4e5 ls -la /workspace\n\n"
          "  abx sandbox exec sbx-a1b2c3d4e5 'cd /workspace && make test'\n\n"
          "  echo hello | abx sandbox exec sbx-a1b2c3d4e5 cat\n\n"
          "  abx sandbox exec --user user --timeout 600 sbx-a1b2c3d4e5 pip install --user rich")
