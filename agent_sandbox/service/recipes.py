"""Templates from recipes: a Dockerfile's steps, a layer each, cached by content.

Every step has a key: a hash of its parent's key, the instruction, and its inputs (the
content of what a COPY copies, the environment, workdir and user a RUN runs with). A step
whose key has a layer is not run again; the first step that misses and every one after it
are. ``RUN`` runs in a real sandbox of this engine started from the layers so far (with
the operator's build network policy), and the host takes nothing out of it but its layer
diff, read by the backend under the one rule. A failed step leaves the layers before it
and no template; builds of one name are one at a time; the sandbox of a step is always
killed, and one left by a build killed mid-step (its process gone) is killed by the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import posixpath
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.core import network as netpolicy
from agent_sandbox.core import recipe as recipes
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxError,
)
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.core.netrules import blocked_address
from agent_sandbox.core.recipe import Step
from agent_sandbox.core.templates import BASE, Template, validate_name

if TYPE_CHECKING:
    from agent_sandbox.service.service import SandboxService

Event = dict[str, Any]
EventFn = Callable[[Event], None]
BUILD_META = "abx.build"  # metadata of a step's sandbox: the building process's pid
STEP_TIMEOUT = 3600.0


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def context_digest(context: Path, sources: list[str], max_bytes: int) -> str:
    """What a COPY copies, by content (names, modes, bytes, link targets): the cache key
    of its step. Read from the user's own context (the copy itself is confined); more
    than ``max_bytes`` is refused before any is read."""
    h = hashlib.sha256()
    total = 0
    real = os.path.realpath(context)
    for source in sources:
        rel = os.path.normpath(source.lstrip("/")) if source not in ("", ".") else "."
        h.update(f"\0src {rel}\0".encode())
        top = context / rel
        # Nothing out of the context is read, even to hash it (a link on the way leading
        # out): the copy refuses it and names why.
        if os.path.commonpath([real, os.path.realpath(top.parent)]) != real:
            continue
        paths = [top] if not top.is_dir() or top.is_symlink() else sorted(
            Path(d) / n for d, dirs, files in os.walk(top) for n in (*dirs, *files))
        for path in paths:
            if rel.startswith("..") or not path.exists() and not path.is_symlink():
                continue  # the copy names what is wrong
            st = path.lstat()
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
            if total > max_bytes:
                raise ResourceExhaustedError(
                    f"the COPY sources {' '.join(sources)} are over {max_bytes >> 20} MiB "
                    "(ABX_BUILD_MAX_LAYER_MB): copy less, or download it in a RUN")
            h.update(f"{path.relative_to(context)}\0{st.st_mode:o}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()


class RecipeBuild:
    """One build of ``name`` from ``text`` (a Dockerfile) with ``context`` for COPY."""

    def __init__(self, service: SandboxService, name: str, text: str, context: Path | None,
                 *, on_event: EventFn | None = None, owner: str = "",
                 network: Any = None, context_tar: bytes | list[bytes] | None = None,
                 force: bool = False, registry_auth: tuple[str, str] | None = None) -> None:
        self.service = service
        self.name = validate_name(name)
        self.steps = recipes.parse(text)
        self.context = context
        self.owner = owner
        # A remote client's context (E2B: one archive per copy), unpacked for the build.
        self.context_tar = [context_tar] if isinstance(context_tar, bytes) else context_tar
        self.force = force  # rebuild every step (E2B's skip_cache)
        self.registry_auth = registry_auth  # (user, password) for FROM an image reference
        self.network = service.config.build_network if network is None else network
        self.emit = on_event or (lambda _event: None)
        self.layers = service.backend.recipes()

    def run(self) -> TemplateInfo:
        if self.name == BASE:
            raise InvalidArgumentError("'base' is the built-in template; choose another name")
        if self.context is not None and not self.context.is_dir():
            raise InvalidArgumentError(f"build context {self.context} is not a directory")
        started = time.monotonic()
        with self.layers.building(self.name), self._context():
            self._kill_orphans()
            tmpl = self._steps()
            self.layers.save(tmpl)
        info = self.service.backend.template_info(tmpl)
        self.emit({"type": "done", "template": self.name,
                   "seconds": round(time.monotonic() - started, 3)})
        return info

    @contextlib.contextmanager
    def _context(self) -> Iterator[None]:
        if self.context_tar is None:
            yield
            return
        with self.layers.unpacked(self.context_tar) as where:
            self.context = where
            yield

    def _kill_orphans(self) -> None:
        kill_orphan_steps(self.service)

    def _steps(self) -> Template:
        total = len(self.steps)
        first = self.steps[0]
        parent, key = self._parent(first.args[0])  # refused before any event
        self._step_event(1, total, first, cached=True)
        inherited: list[str] = list(parent.build_inputs.get("recipe_layers", []))
        keys: list[str] = []  # this recipe's own layers, over the parent's
        env = dict(parent.env)
        workdir, run_dir, user = parent.workdir, "/", parent.user
        start_cmd, ready_cmd, labels = parent.start_cmd, parent.ready_cmd, dict(parent.labels)
        entrypoint: list[str] = []
        for n, step in enumerate(self.steps[1:], 2):
            layers = self.layers.compose(parent, keys)
            state = {"env": env, "dir": run_dir, "user": user}
            key = digest(key, step.kind, step.args, step.pairs, step.shell, step.chown, step.chmod,
                         state if step.kind == "RUN" else None, self._inputs(step))
            makes_layer = step.kind in ("RUN", "COPY", "WORKDIR")
            cached = not makes_layer or (self.layers.has(key) and not self.force)
            self._step_event(n, total, step, cached=cached)
            t0 = time.monotonic()
            if not cached:
                if step.kind == "RUN":
                    self._run(n, step, key, layers, env, run_dir, user)
                elif step.kind == "COPY":
                    self._copy(step, key, layers, run_dir)
                else:
                    self.layers.mkdir(key, layers, posixpath.normpath(step.args[0]))
            if makes_layer:
                keys.append(key)
            if step.kind == "ENV":
                env.update(step.pairs)
            elif step.kind == "WORKDIR":
                workdir = run_dir = posixpath.normpath(step.args[0])
            elif step.kind == "USER":
                user = step.args[0]
            elif step.kind == "LABEL":
                labels.update(step.pairs)
            elif step.kind == "ENTRYPOINT":
                entrypoint = step.args if not step.shell else ["/bin/sh", "-c", step.args[0]]
                start_cmd = step.command() if step.shell else _join(entrypoint)
            elif step.kind == "CMD":
                start_cmd = _join([*entrypoint, *step.args]) if entrypoint and not step.shell \
                    else step.command()
            elif step.kind == "HEALTHCHECK":
                ready_cmd = step.command()
            self.emit({"type": "step_done", "step": n, "of": total, "cached": cached,
                       "seconds": round(time.monotonic() - t0, 3)})
        return replace(parent, name=self.name, kind="recipe", layers=self.layers.compose(
            parent, keys), env=env, workdir=workdir, user=user, start_cmd=start_cmd,
            ready_cmd=ready_cmd, labels=labels, parent=parent.name, created_at=time.time(),
            description=labels.get("description", f"{parent.name} + {total - 1} recipe "
                                   "steps"),
            build_inputs={"recipe_layers": [*inherited, *keys], "recipe_own": keys,
                          "recipe_key": key, "owner": self.owner})

    def _step_event(self, n: int, total: int, step: Step, *, cached: bool) -> None:
        self.emit({"type": "step", "step": n, "of": total, "line": step.line,
                   "instruction": step.text[:500], "cached": cached})

    def _parent(self, ref: str) -> tuple[Template, str]:
        backend = self.service.backend
        try:
            validate_name(ref)
            local = backend.template_exists(ref)
        except InvalidArgumentError:
            local = False
        if local:
            tmpl = backend.template(ref, creating=True)
            built_by = tmpl.build_inputs.get("owner", "") if tmpl.kind == "recipe" else ""
            if self.owner and built_by and built_by != self.owner:
                raise NotFoundError(f"recipe line 1: FROM {ref}: template not found")
            return tmpl, digest("FROM", tmpl.name, self.layers.identity(tmpl),
                                tmpl.build_inputs.get("recipe_key"))
        if self.owner:  # a gateway's tenant: never a file of the host
            registry = recipes.image_registry(ref)
            if registry is None:
                raise NotFoundError(f"recipe line 1: FROM {ref}: no such template here, nor an "
                                    "image reference (over the gateway a recipe starts FROM a "
                                    "template or an image of a registry the builds may reach)")
            self._check_registry(ref, registry)
        return self.layers.from_image(ref, lambda line: self._log(1, "stdout", line + "\n"),
                                      registry_only=bool(self.owner), auth=self.registry_auth)

    def _check_registry(self, ref: str, registry: str) -> None:
        """A tenant's image is pulled by the host, so only from a registry the operator's
        build network policy reaches, at an address no sandbox is kept from (the host's,
        private, link-local) unless the operator opened its range."""
        policy = netpolicy.parse(self.network)
        host = recipes.registry_host(registry)
        try:
            ipaddress.ip_address(host)
            allowed, addresses = policy.allows_address(host), [host]
        except ValueError:
            allowed, addresses = policy.allows_name(host), []
        if not allowed:
            raise PermissionDeniedError(
                f"recipe line 1: FROM {ref}: builds may not reach the registry {host} (the "
                f"build network is {policy.describe()}); the operator allows a registry by "
                "naming it in ABX_BUILD_NETWORK")
        if not addresses:
            try:
                addresses = sorted({str(a[4][0]) for a in socket.getaddrinfo(host, None)})
            except OSError:
                raise NotFoundError(f"recipe line 1: FROM {ref}: the registry {host} does not "
                                    "resolve from this host") from None
        opened = [ipaddress.ip_network(r, strict=False)
                  for r in self.service.config.network_open_ranges]
        for address in addresses:
            if blocked_address(address, opened):
                raise PermissionDeniedError(
                    f"recipe line 1: FROM {ref}: the registry {host} is at {address}, an "
                    "address builds never reach (the host's, private or link-local) unless "
                    "the operator opens its range (ABX_NETWORK_OPEN_RANGES)")

    def _inputs(self, step: Step) -> str | None:
        if step.kind != "COPY":
            return None
        if self.context is None:
            raise InvalidArgumentError(f"recipe line {step.line}: COPY needs a build context "
                                       "(--context DIR)")
        return context_digest(self.context, step.args[:-1],
                              self.service.config.build_max_layer_mb << 20)

    def _copy(self, step: Step, key: str, layers: list[Any], run_dir: str) -> None:
        assert self.context is not None
        dest = step.args[-1]
        if not dest.startswith("/"):
            dest = f"{run_dir.rstrip('/')}/{dest}"
        into = dest.endswith("/")
        dest = posixpath.normpath(dest) + ("/" if into and dest != "/" else "")
        owner = self.layers.owner(layers, step.chown) if step.chown else None
        try:
            self.layers.copy_in(key, layers, self.context, step.args[:-1], dest, owner,
                                step.chmod)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"recipe line {step.line}: {exc.message}") from None

    def _run(self, n: int, step: Step, key: str, layers: list[Any], env: dict[str, str],
             run_dir: str, user: str) -> None:
        svc = self.service
        sandbox = svc.create_from(
            Template(name=f"{self.name}.build", kind="recipe-step", layers=layers),
            owner=self.owner, network=self.network,
            metadata={BUILD_META: str(os.getpid())}, timeout=STEP_TIMEOUT)
        try:
            result = svc.run(sandbox.sandbox_id, step.command(), cwd=run_dir, envs=env,
                             timeout=STEP_TIMEOUT, user=user or None,
                             on_stdout=lambda data: self._log(n, "stdout", data),
                             on_stderr=lambda data: self._log(n, "stderr", data))
            if result.exit_code != 0:
                raise InvalidArgumentError(
                    f"recipe line {step.line} (step {n}) failed with exit code "
                    f"{result.exit_code}: {step.text[:200]}\n{result.stderr[-1500:]}")
            svc.backend.capture_layer(sandbox.sandbox_id, key)
        finally:
            try:
                svc.kill(sandbox.sandbox_id, delete_volume=True)
            except SandboxError:
                pass

    def _log(self, n: int, stream: str, data: str) -> None:
        self.emit({"type": "log", "step": n, "stream": stream, "data": data})


def kill_orphan_steps(service: SandboxService) -> None:
    """Kill the step sandboxes whose build died with its process (a SIGKILL of the CLI or
    the gateway mid-step): the next build does it, and a serving engine's reaper."""
    for info in service.list():
        pid = info.metadata.get(BUILD_META)
        if pid and pid.isdigit() and not _alive(int(pid)):
            try:
                service.kill(info.sandbox_id, delete_volume=True)
            except SandboxError:
                pass


def _join(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
