"""The sandbox service: the Provider, implemented once over a backend.

Everything that is the same wherever sandboxes run lives here: the check of every input
(``core.spec``, ``core.validate``), the limits a create may ask for, the warm pool's
policy, listing and ownership, timeouts and the reaper's decisions (``lifecycle``), ports,
and every call into a sandbox (``guest_ops``, ``dirs``, ``terminals``, the kernels). The
backend keeps the records and starts, stops and reaches the sandboxes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core import validate
from agent_sandbox.core.audit import AuditLog
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    RuntimeUnavailableError,
    SandboxError,
)
from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import SandboxInfo, SandboxLogEntry, TemplateInfo, VolumeInfo
from agent_sandbox.core.network import NetworkSpec
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.core.secrets import SecretInfo, SecretRule, split_host
from agent_sandbox.core.shares import PortShare
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.core.states import VISIBLE, SandboxState
from agent_sandbox.core.templates import Template, validate_name
from agent_sandbox.guestlink.ports import PortForwards
from agent_sandbox.service import lifecycle
from agent_sandbox.service.backend import Backend
from agent_sandbox.service.dirs import DirOps
from agent_sandbox.service.file_locks import FileLocks
from agent_sandbox.service.guest_ops import GuestOps
from agent_sandbox.service.limits import limits_for
from agent_sandbox.service.metrics import MetricsHistory
from agent_sandbox.service.recipes import RecipeBuild, kill_orphan_steps
from agent_sandbox.service.record import SandboxRecord, new_record
from agent_sandbox.service.sandbox_logs import MAX_ENTRIES, START_TAIL, SandboxLogs, output_lines
from agent_sandbox.service.secrets import SecretStore
from agent_sandbox.service.snapshots import SnapshotOps
from agent_sandbox.service.terminals import Terminals

READY_TIMEOUT = 60.0  # seconds a recipe template's ready check may take at create
MAX_BUILDS_PER_OWNER = 2  # recipe builds one API key may run at once
REAP_GAP = 0.1  # seconds between reaper passes at least, however often it is woken


class SandboxService(GuestOps, DirOps, Terminals, FileLocks, SnapshotOps):
    def __init__(self, backend: Backend, config: EngineConfig, *, reaper: bool = True) -> None:
        super().__init__(backend, config)
        self._ports = PortForwards(self.guest)
        self._metrics = MetricsHistory()
        self._logs = SandboxLogs()
        self._audit: AuditLog | None = None
        self.secrets = SecretStore.of(config.data_dir)
        self._builds: dict[str, int] = {}  # recipe builds running, by owner
        self._builds_lock = threading.Lock()
        backend.bind(self)
        if reaper and backend.reaping():
            threading.Thread(target=self._reap_loop, name="abx-reaper", daemon=True).start()

    @property
    def audit(self) -> AuditLog:
        """The service's own decisions (opened on the first: most processes make none)."""
        if self._audit is None:
            self._audit = AuditLog(self.config.audit_log)
        return self._audit

    def close(self) -> None:
        self._stop.set()
        self.reaper_wake.set()
        self._ports.close()
        self.code.close()
        self.backend.close()
        if self._audit is not None:
            self._audit.close()

    # lifecycle ------------------------------------------------------------------------------
    def create(self, *, owner: str = "", **options: Any) -> SandboxInfo:
        spec = CreateSpec.of(options)
        if spec.snapshot is not None:
            forked = self.fork(spec, owner)
            self.reaper_wake.set()
            return forked
        template = self.backend.template(spec.template, creating=True)
        built_by = template.build_inputs.get("owner", "") if template.kind == "recipe" else ""
        if built_by and owner and built_by != owner:  # another tenant's recipe template
            raise NotFoundError(f"template {spec.template!r} not found")
        info = self._create(spec, template, owner)
        self._logs.record(info.sandbox_id, f"created from template {template.name} (idle "
                          f"timeout {info.timeout:g} s)")
        if template.start_cmd or template.ready_cmd:  # a recipe's (here, or pushed)
            self._start_template(info.sandbox_id, template)
        self.reaper_wake.set()  # its deadline may be the next
        return info

    def _start_template(self, sandbox_id: str, template: Template) -> None:
        """A recipe's CMD started in the background, then its ready check (HEALTHCHECK
        CMD) run until it passes; a sandbox whose check never passes is killed."""
        try:
            if template.start_cmd:
                pid = self.start(sandbox_id, template.start_cmd)
                self._logs.started(sandbox_id, pid)
                self._logs.record(sandbox_id, f"start command running (pid {pid}): "
                                  f"{template.start_cmd}")
            deadline = time.monotonic() + READY_TIMEOUT
            while template.ready_cmd:
                if self.run(sandbox_id, template.ready_cmd, timeout=10).exit_code == 0:
                    self._logs.record(sandbox_id, "ready check passed")
                    break
                if time.monotonic() > deadline:
                    raise RuntimeUnavailableError(
                        f"template {template.name!r}: its ready check "
                        f"{template.ready_cmd!r} did not pass within {READY_TIMEOUT:.0f} s")
                time.sleep(0.2)
        except BaseException:
            self.kill(sandbox_id, delete_volume=True)
            raise

    def create_from(self, template: Template, *, owner: str = "", **options: Any
                    ) -> SandboxInfo:
        """A sandbox on ``template``'s layers, which need not be a stored template (a
        recipe build's steps); never from the warm pool."""
        return self._create(CreateSpec.of(options), template, owner, pool=False)

    def _create(self, spec: CreateSpec, template: Template, owner: str, *,
                pool: bool = True) -> SandboxInfo:
        limits = limits_for(spec, self.config.limits, self.backend.limit_caps())
        if spec.network.mode != "off":
            self.backend.check_network(spec.network)
        resolved = self._secrets_for(spec, owner)
        record = new_record(
            spec, owner, template=template.name, limits=limits.__dict__, envs=spec.envs,
            layers=[{"target": x.target, "lowers": x.lowers} for x in template.layers])
        if pool and lifecycle.poolable(spec, limits, self.config):
            claimed = self.backend.claim_pooled(record)
            if claimed is not None:
                if record.envs:  # its warm kernel started without them
                    self.code.unwarm(claimed)
                return self.info(claimed)
        if resolved:
            self.secrets.prepare(record.id, resolved)
        try:
            with self.backend.creating():
                self.backend.make(record, template, new_volume=spec.volume is None)
        except BaseException:
            self.secrets.forget(record.id)
            raise
        return self.info(record.id)

    def _secrets_for(self, spec: CreateSpec, owner: str) -> list[tuple[SecretRule, str]]:
        """The stored secrets ``spec`` names (the owner's own), each of whose hosts its
        network policy must allow: the proxy would refuse them otherwise."""
        if not spec.secrets:
            return []
        if not getattr(self.backend, "injects_secrets", False):
            raise InvalidArgumentError("this engine cannot inject secrets (the runc engine "
                                       "can; see docs/secrets.md)")
        if spec.network.mode == "off":
            raise InvalidArgumentError("secrets are sent by the sandbox's network proxy: give "
                                       "a network policy that allows their hosts")
        resolved = self.secrets.resolve(owner, spec.secrets)
        for rule, _ in resolved:
            for host in rule.hosts:
                if not spec.network.allows_name(split_host(host)[0]):
                    raise InvalidArgumentError(
                        f"secret {rule.name} goes to {host}, which network policy "
                        f"{spec.network.describe()} does not allow: add it to the policy")
        return resolved

    # secrets --------------------------------------------------------------------------------
    def create_secret(self, rule: SecretRule | dict[str, Any], value: str, *,
                      replace: bool = False, owner: str = "") -> SecretInfo:
        """Store a secret for ``owner``'s sandboxes; its rule comes back, never its value."""
        rule = rule if isinstance(rule, SecretRule) else SecretRule(**rule)
        return self.secrets.put(owner, rule, value, replace=replace)

    def list_secrets(self, owner: str = "") -> list[SecretInfo]:
        return self.secrets.list(owner)

    def delete_secret(self, name: str, owner: str = "") -> None:
        self.secrets.delete(owner, name)

    def info(self, sandbox_id: str) -> SandboxInfo:
        return self._info(self.row(sandbox_id))

    def _info(self, r: SandboxRecord) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=r.id, template=r.template, state=r.state, created_at=r.created_at,
            last_used=r.last_used, timeout=r.timeout, persistent=r.persistent,
            network=r.network, volume_id=r.volume_id, metadata=r.metadata, envs=r.envs,
            limits=r.limits, enforced=self.backend.enforced, owner=r.owner,
            lifetime=r.lifetime, on_timeout=r.on_timeout, keep_volume=r.keep_volume)

    def list(self, template: str | None = None, state: str | None = None,
             owner: str | None = None) -> list[SandboxInfo]:
        if state is not None and state not in VISIBLE:
            raise InvalidArgumentError(f"state must be 'running' or 'paused', got {state!r}")
        return [self._info(r) for r in self.backend.records()
                if r.state in VISIBLE
                and (template is None or r.template == template)
                and (state is None or r.state == state)
                and (owner is None or r.owner == owner)]

    def pause(self, sandbox_id: str) -> SandboxInfo:
        self.row(sandbox_id)
        self.backend.pause(sandbox_id)
        self._logs.record(sandbox_id, "paused")
        return self.info(sandbox_id)

    def resume(self, sandbox_id: str) -> SandboxInfo:
        self.row(sandbox_id)
        self.backend.resume(sandbox_id)
        self.reaper_wake.set()
        self._logs.record(sandbox_id, "resumed")
        return self.info(sandbox_id)

    def reset_rootfs(self, sandbox_id: str) -> SandboxInfo:
        """Wipe the system layer (every change outside /workspace); same id, same volume."""
        self.row(sandbox_id)
        self.backend.reset_rootfs(sandbox_id)
        self._logs.record(sandbox_id, "system layer reset (its /workspace kept)")
        return self.info(sandbox_id)

    def set_timeout(self, sandbox_id: str, timeout: float) -> None:
        timeout = CreateSpec.of(timeout=timeout).timeout
        self.row(sandbox_id)
        self.backend.update(sandbox_id, timeout=timeout, last_used=time.time())
        self.reaper_wake.set()  # the deadline moved: shorter ones fire on time
        self._logs.record(sandbox_id, f"idle timeout set to {timeout:g} s")

    def set_network(self, sandbox_id: str, network: NetworkSpec) -> None:
        """Change what a sandbox may reach, without restarting it: its rules are replaced
        and its proxy restarted, so connections open through the old one are closed."""
        policy = parse_policy(network)
        self.row(sandbox_id)
        if policy.mode != "off":
            self.backend.check_network(policy)
        self.backend.set_network(sandbox_id, policy)
        self._logs.record(sandbox_id, f"network policy set: {policy.describe()}")

    def expose_port(self, sandbox_id: str, port: int) -> str:
        """``http://127.0.0.1:N``: reaches ``port`` inside the sandbox from this host
        through the guest channel (any TCP: HTTP, WebSockets...), whatever its network
        policy, for as long as this service lives."""
        port = validate.port(port)
        self.row(sandbox_id)
        return f"http://{self._ports.expose(sandbox_id, port)}"

    def share_port(self, sandbox_id: str, port: int, *, public: bool = False,
                   expires_in: float | None = None) -> PortShare:
        """Share links are a gateway's (they need a URL others can open): refused here
        with where to get one."""
        validate.port(port)
        self.row(sandbox_id)
        raise InvalidArgumentError(
            "share links are made by a gateway (abx serve; docs/ports.md): this engine's "
            f"own URL for the port, {self.expose_port(sandbox_id, port)}, needs no token "
            "but opens only on this host")

    def list_port_shares(self, sandbox_id: str) -> list[PortShare]:
        self.row(sandbox_id)
        return []

    def revoke_port_share(self, sandbox_id: str, share_id: str) -> None:
        raise NotFoundError(f"share link {share_id[:40]!r} not found (this engine makes "
                            "none; a gateway does)")

    def metrics(self, sandbox_id: str, start: float | None = None,
                end: float | None = None) -> list[SandboxMetrics]:
        row = self.row(sandbox_id)
        if row.state == SandboxState.RUNNING:  # a paused one keeps what it had
            self._metrics.sample(row.id, row.created_at, lambda: self.backend.usage(row.id))
            if self._metrics.prune_due():
                self._metrics.keep_only(r.id for r in self.backend.records())
        return self._metrics.samples(row.id, start, end)

    def logs(self, sandbox_id: str) -> list[SandboxLogEntry]:
        row = self.row(sandbox_id)
        lines = self._logs.lines(row.id)
        start = self._logs.start_of(row.id)
        if start is not None and row.state == SandboxState.RUNNING:  # never resumed for it
            try:
                out = self.client(row.id).output(start[0], START_TAIL)
                lines += output_lines(out.stdout.decode(errors="replace"),
                                      out.stderr.decode(errors="replace"), start[1])
            except SandboxError:
                pass  # its guest is away: what the gateway kept is still the log
        return sorted(lines, key=lambda e: e.timestamp)[-MAX_ENTRIES:]

    def kill(self, sandbox_id: str, delete_volume: bool = False) -> None:
        self.row(sandbox_id)
        self._metrics.forget(sandbox_id)
        self._logs.forget(sandbox_id)
        self._ports.close(sandbox_id)
        self.backend.kill(sandbox_id, delete_volume=bool(delete_volume))
        self.secrets.forget(sandbox_id)

    # templates, volumes, the pool and the host ------------------------------------------------
    def list_templates(self) -> list[TemplateInfo]:
        return self.backend.list_templates()

    def import_template(self, name: str, source: str, *, replace: bool = False,
                        **meta: Any) -> TemplateInfo:
        """A root filesystem directory or an OCI / docker image archive as a template
        (``meta``: env, workdir, commands, description, ref, progress)."""
        return self.backend.import_template(validate_name(name), source, replace=replace,
                                            **meta)

    def build_template(self, name: str, *, index_url: str | None = None, force: bool = False,
                       progress: Callable[[str], None] | None = None) -> tuple[TemplateInfo, str]:
        """Build a template from its recipe (``code-interpreter-v1``); returns it and
        where it lives."""
        return self.backend.build_template(validate_name(name), index_url=index_url,
                                           force=force, progress=progress)

    def remove_template(self, name: str) -> None:
        self.backend.remove_template(validate_name(name))

    def build_recipe(self, name: str, recipe: str, *, context: str | None = None,
                     on_event: Callable[[dict[str, Any]], None] | None = None,
                     owner: str = "", network: NetworkSpec | None = None,
                     context_tar: bytes | list[bytes] | None = None, force: bool = False,
                     registry_auth: tuple[str, str] | None = None) -> TemplateInfo:
        """A template from a recipe (a Dockerfile's text), a cached layer per step;
        ``on_event`` gets each step, its output and the end as they happen. ``network``:
        what RUN steps may reach (the operator's choice; default ABX_BUILD_NETWORK).
        ``context_tar``: a remote client's build context, as tar archives; ``force``:
        rebuild every step, cached or not; ``registry_auth``: (user, password) for a
        registry ``FROM`` pulls from."""
        where = Path(context) if context else None
        build = RecipeBuild(self, name, recipe, where, on_event=on_event, owner=owner,
                            network=network, context_tar=context_tar, force=force,
                            registry_auth=registry_auth)
        with self._builds_lock:  # a tenant's builds hold sandboxes of their own
            if owner and self._builds.get(owner, 0) >= MAX_BUILDS_PER_OWNER:
                raise ResourceExhaustedError(f"at most {MAX_BUILDS_PER_OWNER} template builds "
                                             "at once per API key; wait for one to end")
            self._builds[owner] = self._builds.get(owner, 0) + 1
        try:
            return build.run()
        finally:
            with self._builds_lock:
                self._builds[owner] -= 1

    def prune_layers(self) -> tuple[int, int]:
        """Remove the recipe layers no template uses: (layers, bytes) freed."""
        return self.backend.prune_layers()

    def list_volumes(self) -> list[VolumeInfo]:
        return self.backend.volumes()

    def delete_volume(self, volume_id: str) -> None:
        self.backend.delete_volume(volume_id)

    def drain_pool(self) -> int:
        """Destroy every warm, unclaimed sandbox; returns how many."""
        return self.backend.drain_pool()

    def disk_headroom(self) -> dict[str, int] | None:
        return self.backend.disk_headroom()

    def limit_caps(self) -> dict[str, tuple[float, str]]:
        """The most one sandbox may have here, by create option (the gateway states it)."""
        return self.backend.limit_caps()

    def engine_info(self) -> dict[str, Any]:
        """Which backend runs here and what it really enforces (``abx doctor`` shows it)."""
        return self.backend.describe()

    # idle timeouts --------------------------------------------------------------------------
    def reap_once(self, now: float | None = None) -> float | None:
        """Act on the reaper's decision for every sandbox (``lifecycle.decide``); returns
        when the next may be due (``lifecycle.next_change``; None: none by the clock)."""
        now = time.time() if now is None else now
        records = self.backend.records()
        self._logs.keep_only({r.id for r in records})
        for record in records:
            try:
                step = self.decide(record, now)
                if step is lifecycle.Step.PAUSE:
                    self.backend.pause(record.id)
                elif step is lifecycle.Step.RELEASE:
                    self.backend.release(record.id)
                if step is not None and not step.ends:
                    self._logs.record(record.id, f"{step.name.lower()}d: {step.value}")
                elif step is not None and step.ends:
                    self.end(record, step)
            except Exception:  # noqa: BLE001 - one bad sandbox must not stop the reaper
                continue
        return self.next_reap()

    def next_reap(self) -> float | None:
        """The earliest time the reaper's decision may change for any sandbox (read after
        this pass acted: a sandbox paused now has a later deadline)."""
        times = [self.next_change(r) for r in self.backend.records()]
        return min((t for t in times if t is not None), default=None)

    def next_change(self, record: SandboxRecord) -> float | None:
        return lifecycle.next_change(record, busy=self.activity.active(record.id),
                                     paused_stop_after=self.config.paused_stop_after,
                                     paused_max_age=self.config.paused_max_age)

    def wait_reap(self, due: float | None, longest: float, gap: float = REAP_GAP) -> bool:
        """Sleep until ``due`` (a time from ``reap_once``), at most ``longest`` seconds, or
        until a change wakes the reaper; True once the service is closing. No polling:
        a timeout fires at its deadline, whatever ``longest`` is."""
        wait = longest if due is None else min(longest, max(0.0, due - time.time()) + 0.01)
        # Not sooner than ``gap`` after the last pass: a busy sandbox's calls each end
        # with a wake, and a new deadline is always a timeout (>= 1 s) away.
        time.sleep(min(wait, gap))
        self.reaper_wake.wait(max(0.0, wait - gap))
        self.reaper_wake.clear()  # changes from here on wake the next wait
        return self._stop.is_set()

    def decide(self, record: SandboxRecord, now: float) -> lifecycle.Step | None:
        return lifecycle.decide(record, now, busy=self.activity.active(record.id),
                                paused_stop_after=self.config.paused_stop_after,
                                paused_max_age=self.config.paused_max_age)

    def end(self, record: SandboxRecord, step: lifecycle.Step) -> None:
        """A sandbox's end of life: killed, its volume kept or deleted as it asked, and
        the audit log says why."""
        self._ports.close(record.id)
        self._logs.forget(record.id)
        self.backend.kill(record.id, delete_volume=not record.keep_volume)
        self.secrets.forget(record.id)
        self.audit.record(event="sandbox.end", sandbox_id=record.id, owner=record.owner,
                          reason=step.value, volume_id=record.volume_id,
                          volume="kept" if record.keep_volume else "deleted")

    def _reap_loop(self) -> None:
        """Reaps at each sandbox's next deadline (or when woken); the rest of the upkeep
        (orphaned build steps, the backend's) every ``reaper_interval`` seconds."""
        interval = self.config.reaper_interval
        due: float | None = None
        upkeep = time.monotonic() + interval
        while not self.wait_reap(due, max(0.0, upkeep - time.monotonic())):
            try:
                due = self.reap_once()
                if time.monotonic() >= upkeep:
                    upkeep = time.monotonic() + interval
                    kill_orphan_steps(self)  # of recipe builds whose process died mid-step
                    self.backend.maintain()
            except Exception:  # noqa: BLE001 - keep reaping whatever happened
                due = None
                continue
