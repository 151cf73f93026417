"""Template recipes: the Dockerfile instructions agents and people use, parsed strictly.

A recipe is a list of ``Step``s. Supported: ``FROM``, ``RUN``, ``COPY``/``ADD`` (local
context files, ``--chown``), ``ENV``, ``WORKDIR``, ``USER``, ``ARG``, ``LABEL``, ``CMD``,
``ENTRYPOINT`` and ``HEALTHCHECK CMD`` (the ready check). Anything else is refused with its
line number and the list of what is supported: a recipe that half works is worse than one
that says what to change. Line continuations (``\\``), comments, the exec (JSON) and shell
forms, and ``$VAR``/``${VAR}`` substitution of ``ARG``/``ENV`` in the instructions Docker
substitutes are handled; parser directives and heredocs are not.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from agent_sandbox.core.errors import InvalidArgumentError

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG", "LABEL", "CMD",
             "ENTRYPOINT", "HEALTHCHECK")
MAX_RECIPE_BYTES = 1 << 20
MAX_STEPS = 500
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SUBSTITUTED = {"ADD", "COPY", "ENV", "LABEL", "USER", "WORKDIR", "FROM"}


@dataclass
class Step:
    """One instruction. ``args`` by kind: FROM [ref]; RUN/CMD/ENTRYPOINT/HEALTHCHECK
    [argv...] with ``shell`` telling the shell form (one string); COPY [src..., dest];
    ENV/LABEL/ARG pairs in ``pairs``; WORKDIR/USER [value]."""

    line: int
    kind: str
    args: list[str] = field(default_factory=list)
    pairs: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    chown: str = ""
    chmod: int | None = None
    text: str = ""

    def command(self) -> str:
        """A RUN's (or CMD's...) command line as ``/bin/sh -c`` takes it."""
        return self.args[0] if self.shell else shlex.join(self.args)


def _refuse(line: int, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"recipe line {line}: {what}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, joined text) with comments and continuations folded."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not buf:
            start = number
        if raw.rstrip().endswith("\\"):
            buf.append(raw.rstrip()[:-1])
            continue
        buf.append(raw)
        out.append((start, " ".join(part.strip() for part in buf).strip()))
        buf = []
    if buf:
        out.append((start, " ".join(part.strip() for part in buf).strip()))
    return out


def _substitute(value: str, env: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        got = env.get(name)
        return got if got else (default or "")
    return _VAR.sub(one, value)


def _pairs(line: int, rest: str, kind: str, env: dict[str, str], *, substitute: bool
           ) -> dict[str, str]:
    """``K=V K2="v 2"`` or the old ``K V`` form of ENV/LABEL."""
    try:
        words = shlex.split(rest, posix=True)
    except ValueError as exc:
        raise _refuse(line, f"{kind}: {exc}") from None
    if not words:
        raise _refuse(line, f"{kind} needs NAME=VALUE")
    out: dict[str, str] = {}
    if "=" not in words[0]:
        if kind == "ARG" and len(words) == 1:
            return {words[0]: ""}
        if kind in ("ENV", "LABEL"):
            name, _, value = rest.strip().partition(" ")
            return {name: _substitute(value.strip(), env) if substitute else value.strip()}
        raise _refuse(line, f"{kind} takes NAME=VALUE, got {rest!r}")
    for word in words:
        name, eq, value = word.partition("=")
        if not eq:
            raise _refuse(line, f"{kind}: {word!r} is not NAME=VALUE")
        out[name] = _substitute(value, env) if substitute else value
    for name in out:
        if kind != "LABEL" and not _NAME.match(name):
            raise _refuse(line, f"{kind}: {name!r} is not a variable name")
    return out


def _exec_or_shell(line: int, rest: str, kind: str) -> tuple[list[str], bool]:
    if rest.startswith("["):
        try:
            argv = json.loads(rest)
        except ValueError:
            argv = None
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise _refuse(line, f"{kind}'s exec form must be a JSON list of strings")
        return argv, False
    if not rest:
        raise _refuse(line, f"{kind} needs a command")
    return [rest], True


def parse(text: str) -> list[Step]:
    """The recipe's steps, FROM first; InvalidArgumentError naming the line otherwise."""
    if len(text.encode()) > MAX_RECIPE_BYTES:
        raise InvalidArgumentError(f"the recipe is over {MAX_RECIPE_BYTES} bytes")
    steps: list[Step] = []
    args: dict[str, str] = {}  # ARG values, substituted like ENV
    env: dict[str, str] = {}
    for number, logical in _logical_lines(text):
        word, _, rest = logical.partition(" ")
        kind, rest = word.upper(), rest.strip()
        if kind not in SUPPORTED:
            raise _refuse(number, f"{word} is not supported; a recipe may use "
                          f"{', '.join(SUPPORTED)} (HEALTHCHECK CMD as the ready check)")
        if not steps and kind not in ("FROM", "ARG"):
            raise _refuse(number, f"the recipe must start with FROM, not {word}")
        if steps and kind == "FROM":
            raise _refuse(number, "only one FROM: multi-stage recipes are not supported")
        values = {**args, **env}
        if kind in _SUBSTITUTED and kind not in ("ENV", "LABEL"):
            rest = _substitute(rest, values)
        step = Step(line=number, kind="COPY" if kind == "ADD" else kind, text=logical)
        if kind == "FROM":
            parts = rest.split()
            if len(parts) != 1:
                raise _refuse(number, "FROM takes one template or image (no AS, no --platform)")
            step.args = parts
        elif kind in ("RUN", "CMD", "ENTRYPOINT"):
            step.args, step.shell = _exec_or_shell(number, rest, kind)
        elif kind == "HEALTHCHECK":
            head, _, cmd = rest.partition(" ")
            if head.upper() != "CMD":
                raise _refuse(number, "HEALTHCHECK takes CMD <command> (its options are not "
                              "supported)")
            step.args, step.shell = _exec_or_shell(number, cmd.strip(), kind)
        elif kind in ("COPY", "ADD"):
            _copy_args(step, rest, kind)
        elif kind in ("ENV", "LABEL", "ARG"):
            step.pairs = _pairs(number, rest, kind, values, substitute=kind != "ARG")
            if kind == "ARG":
                for name, value in step.pairs.items():
                    args.setdefault(name, _substitute(value, values))
                if not steps:
                    continue  # an ARG before FROM only feeds FROM
            elif kind == "ENV":
                env.update(step.pairs)
        elif kind in ("WORKDIR", "USER"):
            if not rest or (kind == "USER" and len(rest.split()) != 1):
                raise _refuse(number, f"{kind} takes one value")
            if kind == "WORKDIR" and not rest.startswith("/"):
                base = next((s.args[0] for s in reversed(steps) if s.kind == "WORKDIR"), "/")
                rest = base.rstrip("/") + "/" + rest
            step.args = [rest]
        steps.append(step)
        if len(steps) > MAX_STEPS:
            raise _refuse(number, f"a recipe has at most {MAX_STEPS} steps")
    if not steps:
        raise InvalidArgumentError("the recipe is empty: it needs at least a FROM line")
    return steps


def _copy_args(step: Step, rest: str, kind: str) -> None:
    line = step.line
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        rest = rest.strip()
        name, _, value = flag.partition("=")
        if name == "--chown" and value:
            step.chown = value
        elif name == "--chmod" and re.fullmatch(r"[0-7]{3,4}", value):
            step.chmod = int(value, 8)
        else:
            raise _refuse(line, f"{kind} supports only --chown=USER[:GROUP] and "
                          f"--chmod=OCTAL, not {flag}")
    if rest.startswith("["):
        try:
            words = json.loads(rest)
        except ValueError:
            words = None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise _refuse(line, f"{kind}'s JSON form must be a list of strings")
    else:
        words = rest.split()
    if kind == "ADD" and any("://" in w for w in words):
        raise _refuse(line, "ADD of a URL is not supported: RUN curl/wget it instead")
    if len(words) < 2:
        raise _refuse(line, f"{kind} needs a source and a destination")
    step.args = words


# An image reference as Docker spells it: [registry[:port]/]path[:tag][@sha256:digest].
_IMAGE_REF = re.compile(
    r"^(?:(?P<first>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*"
    r"[A-Za-z0-9])?)*(?::[0-9]{1,5})?|\[[0-9A-Fa-f:]+\](?::[0-9]{1,5})?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")
DEFAULT_REGISTRY = "docker.io"


def image_registry(ref: str) -> str | None:
    """The registry (``host[:port]``) an image reference is pulled from, Docker's way (a
    first component with a dot, a port or ``localhost`` names it, else Docker Hub);
    None when ``ref`` is no image reference (a path, say)."""
    found = _IMAGE_REF.fullmatch(ref)
    if found is None:
        return None
    first = found.group("first")
    if first is None:
        return DEFAULT_REGISTRY
    if "." in first or ":" in first or first == "localhost":
        return first.lower()
    return DEFAULT_REGISTRY


def registry_host(registry: str) -> str:
    """A registry's host without its port (an IPv6 address without brackets)."""
    if registry.startswith("["):
        return registry[1:registry.index("]")]
    return registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
