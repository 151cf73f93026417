"""Engine benchmark: create/exec latency, memory per idle sandbox, density, and peers.

Run by hand, as root, from the repository root::

    .venv/bin/python bench/engine.py [--sandboxes 200] [--iterations 50] [--json]

Everything is measured in one run against a private data dir under /var/tmp (removed at
the end, also on Ctrl-C). The rootless engine's create/exec figures come from the same
script run as a temporary unprivileged user (made with useradd, removed at the end; skip
with ``--no-rootless``). Progress goes to stderr; the results table (or, with ``--json``,
one JSON object) to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from _common import fmt_mb, fmt_ms, fmt_ratio, median, progress, summary, table
from _floor import bare_runc_run

if TYPE_CHECKING:
    from agent_sandbox import Sandbox
    from agent_sandbox.service.service import SandboxService
# What the engine is meant to reach on a small host (issue 34's targets).
TARGET_CREATE_P50_MS = 40.0
TARGET_CREATE_VS_FLOOR = 1.1  # cold create p50 / bare `runc run` p50, same run
TARGET_EXEC_P50_MS = 5.0
TARGET_IDLE_BYTES = 2 * 1024 * 1024
TARGET_ALIVE = 200

BWRAP_ARGS = ["--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
              "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
              "--symlink", "usr/lib", "/lib", "--proc", "/proc", "--dev", "/dev", "true"]
PODMAN_IMAGE = "localhost/abx-bench-busybox:latest"
PODMAN_ARGS = ["run", "--rm", "--network", "none", "--runtime", "runc",
               "--cgroup-manager", "cgroupfs", "--ulimit", "nofile=4096:4096",
               "--ulimit", "nproc=4096:4096", PODMAN_IMAGE, "true"]
# Debian package that provides each peer's binary (installed if missing).
PEER_PACKAGES = {"bwrap": "bubblewrap", "podman": "podman", "busybox": "busybox-static"}

FLEET_DISK_MB = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sandboxes", type=int, default=200,
                   help="K: sandboxes alive at once for the memory/density phase (200)")
    p.add_argument("--iterations", type=int, default=50,
                   help="N: creates (each followed by a kill) per create measurement (50)")
    p.add_argument("--exec-runs", type=int, default=200,
                   help="timed commands.run('true') round trips, after 10 warm-up runs (200)")
    p.add_argument("--pool-size", type=int, default=4,
                   help="warm pool size for the 'pooled' create measurement (4)")
    p.add_argument("--idle", type=float, default=2.0,
                   help="seconds the K sandboxes idle before memory is read (2)")
    p.add_argument("--bwrap-runs", type=int, default=50)
    p.add_argument("--podman-runs", type=int, default=20)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="engine data dir (default: a fresh /var/tmp/abx-bench-XXXX, removed)")
    p.add_argument("--no-install", action="store_true",
                   help="do not apt-get install missing peers (bubblewrap, podman, busybox)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--no-rootless", action="store_true",
                   help="skip the rootless phase (create/exec as a temporary plain user)")
    p.add_argument("--rootless-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("sandboxes", "iterations", "exec_runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# host probes ------------------------------------------------------------------------------
def mem_available() -> int:
    """MemAvailable from /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and all its descendants, via /proc/<pid>/task/*/children."""
    pids = [root_pid]
    i = 0
    while i < len(pids):
        try:
            tasks = list(Path(f"/proc/{pids[i]}/task").iterdir())
        except OSError:
            tasks = []
        for task in tasks:
            try:
                pids.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
        i += 1
    return pids


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def runc_pid(runc_root: Path, sandbox_id: str) -> int | None:
    proc = subprocess.run(["runc", "--root", str(runc_root), "state", sandbox_id],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    pid = json.loads(proc.stdout).get("pid")
    return int(pid) if pid else None


def cgroup_usage(sandbox_id: str) -> int | None:
    path = Path(f"/sys/fs/cgroup/memory/abx/{sandbox_id}/memory.usage_in_bytes")
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def host_info() -> dict[str, Any]:
    runc = subprocess.run(["runc", "--version"], capture_output=True, text=True).stdout
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "mem_total_mb": int(Path("/proc/meminfo").read_text().split()[1]) // 1024,
        "runc": runc.splitlines()[0] if runc else "?",
        "python": platform.python_version(),
    }


def limits_snapshot() -> dict[str, str]:
    """Host limits that a few hundred sandboxes can run into (for the report)."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "?"
    loops = sum(1 for p in Path("/dev").glob("loop[0-9]*"))
    return {
        "loop_devices": str(loops),
        "max_loop": read("/sys/module/loop/parameters/max_loop"),
        "inotify_max_user_instances": read("/proc/sys/fs/inotify/max_user_instances"),
        "pid_max": read("/proc/sys/kernel/pid_max"),
        "threads_max": read("/proc/sys/kernel/threads-max"),
        "nr_open": read("/proc/sys/fs/nr_open"),
        "file_nr": read("/proc/sys/fs/file-nr"),
    }


# peers ------------------------------------------------------------------------------------
def ensure_packages(binaries: list[str], allow_install: bool) -> dict[str, str]:
    """apt-get install the packages of missing binaries; returns {binary: why missing}."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing and allow_install and shutil.which("apt-get"):
        packages = [PEER_PACKAGES[b] for b in missing]
        progress(f"installing {' '.join(packages)} (apt-get)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", *packages]
        if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
            subprocess.run(cmd, capture_output=True, env=env)
    return {b: f"{b} not installed (apt-get install {PEER_PACKAGES[b]})"
            for b in binaries if shutil.which(b) is None}


def run_quiet(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=timeout)


def time_one_shot(argv: list[str], runs: int, warmup: int) -> dict[str, Any]:
    """p50/p95 of a one-shot command; ``{"skipped": reason}`` if it does not work."""
    samples: list[float] = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        try:
            proc = run_quiet(argv)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"skipped": f"{argv[0]}: {exc}"}
        elapsed = (time.perf_counter() - start) * 1000
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            return {"skipped": f"{argv[0]} exited {proc.returncode}: "
                               f"{err[-1] if err else '(no output)'}"}
        if i >= warmup:
            samples.append(elapsed)
    return summary(samples)


def ensure_podman_image() -> str | None:
    """Import a busybox-static rootfs as PODMAN_IMAGE once; returns a reason on failure."""
    if run_quiet(["podman", "image", "exists", PODMAN_IMAGE]).returncode == 0:
        return None
    busybox = shutil.which("busybox")
    if busybox is None:
        return "no busybox binary to build a local image from (apt-get install busybox-static)"
    with tempfile.TemporaryDirectory(prefix="abx-bench-img-") as tmp:
        root = Path(tmp) / "root"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(busybox, root / "bin" / "busybox")
        for applet in ("true", "sh", "echo"):
            (root / "bin" / applet).symlink_to("busybox")
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(root, arcname=".")
        proc = subprocess.run(["podman", "import", str(tar_path), PODMAN_IMAGE],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        return f"podman import failed: {proc.stderr.strip()[-300:]}"
    return None


def measure_peers(args: argparse.Namespace) -> dict[str, Any]:
    missing = ensure_packages(["bwrap", "podman", "busybox"], not args.no_install)
    peers: dict[str, Any] = {}
    if "bwrap" in missing:
        peers["bwrap"] = {"skipped": missing["bwrap"]}
    else:
        progress(f"peer: bwrap one-shot x{args.bwrap_runs}")
        peers["bwrap"] = time_one_shot(["bwrap", *BWRAP_ARGS], args.bwrap_runs, warmup=3)
    if "podman" in missing:
        peers["podman"] = {"skipped": missing["podman"]}
    else:
        reason = ensure_podman_image()
        if reason:
            peers["podman"] = {"skipped": reason}
        else:
            progress(f"peer: podman run --rm x{args.podman_runs}")
            peers["podman"] = time_one_shot(["podman", *PODMAN_ARGS], args.podman_runs,
                                            warmup=2)
    for name, res in peers.items():
        if "skipped" in res:
            progress(f"peer {name} skipped: {res['skipped']}")
    return peers


# the engine -------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results: dict[str, Any] = {"host": host_info(), "params": {
            "sandboxes": args.sandboxes, "iterations": args.iterations,
            "exec_runs": args.exec_runs, "pool_size": args.pool_size, "idle_s": args.idle}}
        self.data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="abx-bench-",
                                                               dir="/var/tmp"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o711)
        # Set before any engine exists; the default (SDK) engine never keeps a pool.
        os.environ["ABX_DATA_DIR"] = str(self.data_dir)
        os.environ["ABX_POOL_SIZE"] = "0"
        self.results["params"]["data_dir"] = str(self.data_dir)
        self.pooled: SandboxService | None = None
        self.engine_started = False

    @property
    def runc_root(self) -> Path:
        return self.data_dir / "runc"

    def default_engine(self) -> SandboxService:
        from agent_sandbox.providers.local import local_provider

        engine = local_provider()
        self.engine_started = True
        return engine

    # phases -------------------------------------------------------------------------------
    def run(self) -> None:
        progress(f"data dir {self.data_dir}")
        self.default_engine()
        self.warm_up()
        self.results["create_cold"] = self.create_cycle("cold", provider=None)
        progress(f"floor: bare runc run (busybox true) x{self.args.iterations}")
        self.results["floor"] = bare_runc_run(self.args.iterations)
        self.results["exec"] = self.exec_round_trips()
        if _engine_has_pool():
            self.results["create_pooled"] = self.pooled_cycle()
        else:
            self.results["create_pooled"] = {"skipped": "the engine has no warm pool"}
        self.results["peers"] = measure_peers(self.args)
        self.results["rootless"] = self.rootless()
        self.fleet()

    def run_rootless_child(self) -> None:
        """The rootless phase's own figures (this process is the unprivileged user)."""
        progress(f"rootless: data dir {self.data_dir}")
        self.default_engine()
        self.warm_up()
        self.results["create_cold"] = self.create_cycle("rootless", provider=None)
        self.results["exec"] = self.exec_round_trips()

    def rootless(self) -> dict[str, Any]:
        """Create/exec as an ordinary user: this script again, as a user made for it."""
        if self.args.no_rootless:
            return {"skipped": "--no-rootless"}
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from localusers import LocalUsers  # the test suite's real-user helper

        users = LocalUsers()
        reason = users.missing()
        if reason:
            return {"skipped": reason}
        progress("rootless: same create/exec cycle as a temporary unprivileged user")
        try:
            user = users.create()
            argv = [sys.executable, str(Path(__file__).resolve()), "--rootless-child",
                    "--json", "--iterations", str(self.args.iterations),
                    "--exec-runs", str(self.args.exec_runs)]
            proc = subprocess.Popen(user.argv(argv), env=user.env(), cwd=str(user.home),
                                    stdout=subprocess.PIPE, text=True)
            out, _ = proc.communicate(timeout=1800)  # its progress goes to our stderr
        finally:
            users.cleanup()
        if proc.returncode != 0:
            return {"skipped": f"the rootless run exited {proc.returncode}"}
        child = json.loads(out)
        return {"create_cold": child["create_cold"], "exec": child["exec"],
                "engine": child.get("engine", {})}

    def warm_up(self) -> None:
        """First creates build the template views and the blank disk image: not timed."""
        from agent_sandbox import Sandbox

        progress("warm-up: 2 creates (template views, blank disk image)")
        for _ in range(2):
            sb = Sandbox.create()
            sb.commands.run("true")
            sb.kill(delete_volume=True)

    def create_cycle(self, label: str, provider: SandboxService | None,
                     before_each: Callable[[], None] | None = None) -> dict[str, Any]:
        """N x (create, first exec, kill), each step timed on its own."""
        from agent_sandbox import Sandbox

        n = self.args.iterations
        create: list[float] = []
        first: list[float] = []
        kill: list[float] = []
        cycle: list[float] = []
        for i in range(n):
            if before_each:
                before_each()
            t0 = time.perf_counter()
            sb = Sandbox.create(provider=provider)
            t1 = time.perf_counter()
            try:
                sb.commands.run("true")
                t2 = time.perf_counter()
            finally:
                sb.kill(delete_volume=True)
            t3 = time.perf_counter()
            create.append((t1 - t0) * 1000)
            first.append((t2 - t1) * 1000)
            kill.append((t3 - t2) * 1000)
            cycle.append((t3 - t0) * 1000)
            if (i + 1) % 10 == 0 or i + 1 == n:
                progress(f"create ({label}) {i + 1}/{n}: p50 {fmt_ms(median(create))}")
        return {"create": summary(create), "first_exec": summary(first),
                "kill": summary(kill), "cycle": summary(cycle)}

    def exec_round_trips(self) -> dict[str, Any]:
        from agent_sandbox import Sandbox

        runs = self.args.exec_runs
        progress(f"exec: 10 warm-up + {runs} x commands.run('true')")
        sb = Sandbox.create()
        try:
            for _ in range(10):
                sb.commands.run("true")
            samples: list[float] = []
            for _ in range(runs):
                start = time.perf_counter()
                res = sb.commands.run("true")
                samples.append((time.perf_counter() - start) * 1000)
                if res.exit_code != 0:
                    raise RuntimeError(f"`true` exited {res.exit_code}: {res.stderr}")
        finally:
            sb.kill(delete_volume=True)
        return summary(samples)

    def pooled_cycle(self) -> dict[str, Any]:
        """The same cycle against an engine keeping a warm pool, each create with the pool
        full (a pool hit); kills here overlap the refill, so only cold kills are reported."""
        from agent_sandbox.config.engine import EngineConfig
        from agent_sandbox.providers.local import embedded_service

        size = self.args.pool_size
        if size < 1:
            return {"skipped": "--pool-size 0"}
        progress(f"pooled: engine with pool_size={size}, filling")
        self.pooled = embedded_service(EngineConfig(pool_size=size), reaper=False)
        pooled = self.pooled

        def wait_full() -> None:
            deadline = time.monotonic() + 120
            while pooled.backend.store.count_pooled("base") < size:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"warm pool did not refill to {size} within 120 s")
                time.sleep(0.005)

        try:
            out = self.create_cycle("pooled", provider=pooled, before_each=wait_full)
        finally:
            stop_pool(pooled)
            self.pooled = None
        out["pool_size"] = size
        return out

    def fleet(self) -> dict[str, Any]:
        """K sandboxes at once: time to create them, memory per idle one, all alive?"""
        from agent_sandbox import Sandbox

        k = self.args.sandboxes
        out: dict[str, Any] = {"k": k, "limits_before": limits_snapshot()}
        self.results["fleet"] = out  # partial figures survive a Ctrl-C
        time.sleep(1.0)
        avail_before = mem_available()
        sandboxes: list[Sandbox] = []
        latencies: list[float] = []
        start = time.perf_counter()
        for i in range(k):
            t0 = time.perf_counter()
            try:
                sandboxes.append(Sandbox.create(disk_mb=FLEET_DISK_MB))
            except Exception as exc:  # noqa: BLE001 - the failure is the finding
                out["create_error"] = f"create #{i + 1} failed: {type(exc).__name__}: {exc}"
                progress(out["create_error"])
                break
            latencies.append((time.perf_counter() - t0) * 1000)
            if (i + 1) % 25 == 0 or i + 1 == k:
                out["created"] = len(sandboxes)
                progress(f"created {i + 1}/{k} ({time.perf_counter() - start:.1f} s, "
                         f"last create {fmt_ms(latencies[-1])})")
        out["created"] = len(sandboxes)
        out["create_all_s"] = time.perf_counter() - start
        out["create_latency"] = summary(latencies)
        out["create_latency_last10pct"] = summary(latencies[-max(1, len(latencies) // 10):])
        out["limits_after"] = limits_snapshot()
        if not sandboxes:
            return out
        progress(f"idling {self.args.idle:g} s, then reading memory")
        time.sleep(self.args.idle)
        out["memory"] = self.memory(sandboxes, avail_before)
        out["alive"], out["alive_errors"] = check_alive(sandboxes)
        progress(f"alive: {out['alive']}/{k}")
        out["exec_with_fleet"] = exec_sample(sandboxes[len(sandboxes) // 2], 50)
        progress(f"killing {len(sandboxes)}")
        t0 = time.perf_counter()
        for i, sb in enumerate(sandboxes):
            sb.kill(delete_volume=True)
            if (i + 1) % 50 == 0:
                progress(f"killed {i + 1}/{len(sandboxes)}")
        out["kill_all_s"] = time.perf_counter() - t0
        return out

    def memory(self, sandboxes: list[Sandbox], avail_before: int) -> dict[str, Any]:
        n = len(sandboxes)
        avail_after = mem_available()
        pss_total = 0
        cgroup_total = 0
        procs = 0
        no_pid = 0
        no_cgroup = 0
        for sb in sandboxes:
            pid = runc_pid(self.runc_root, sb.sandbox_id)
            if pid is None:
                no_pid += 1
            else:
                tree = process_tree(pid)
                procs += len(tree)
                pss_total += sum(pss_bytes(p) for p in tree)
            usage = cgroup_usage(sb.sandbox_id)
            if usage is None:
                no_cgroup += 1
            else:
                cgroup_total += usage
        return {
            "n": n,
            "mem_available_drop_bytes": avail_before - avail_after,
            "per_sandbox_mem_available": (avail_before - avail_after) / n,
            "per_sandbox_pss": pss_total / n,
            "per_sandbox_cgroup": cgroup_total / n,
            "processes_per_sandbox": procs / n,
            "missing_pid": no_pid,
            "missing_cgroup": no_cgroup,
        }

    # cleanup ------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Kill every sandbox of the data dir, then remove it (Ctrl-C is ignored meanwhile)."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.pooled is not None:
                stop_pool(self.pooled)
                self.pooled = None
            if self.engine_started or (self.data_dir / "state.db").exists():
                self._kill_everything()
            if self.args.data_dir is None:
                from agent_sandbox.backends.runc.host import rootless_setup as rootless

                if os.geteuid():  # files of the sandboxes' subordinate ids are left
                    rootless.remove_tree(self.data_dir)
                else:
                    shutil.rmtree(self.data_dir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, old)

    def _kill_everything(self) -> None:
        engine = self.default_engine()
        engine.drain_pool()
        left = engine.list()
        if left:
            progress(f"cleanup: killing {len(left)} sandboxes")
        for info in left:
            try:
                engine.kill(info.sandbox_id, delete_volume=True)
            except Exception as exc:  # noqa: BLE001 - keep cleaning
                progress(f"cleanup: kill {info.sandbox_id} failed: {exc}")
        engine.backend.recover()  # half-made ones whose creator is gone
        for volume in engine.list_volumes():
            if not volume.attached_to:
                engine.delete_volume(volume.volume_id)
        engine.close()
        try:
            engine.backend.release_host_mounts()
        except Exception as exc:  # noqa: BLE001
            progress(f"cleanup: {exc}")


def _engine_has_pool() -> bool:
    from agent_sandbox.config.engine import EngineConfig

    return "pool_size" in getattr(EngineConfig, "__dataclass_fields__", {})


def stop_pool(engine: SandboxService) -> None:
    """Stop the refill thread, let an in-flight refill finish, destroy what it made."""
    engine.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            r.state == "creating" for r in engine.backend.store.list_sandboxes()):
        time.sleep(0.05)
    engine.drain_pool()


def check_alive(sandboxes: list[Sandbox]) -> tuple[int, list[str]]:
    alive = 0
    errors: list[str] = []
    for sb in sandboxes:
        try:
            res = sb.commands.run("echo ok", timeout=30)
            if res.exit_code == 0 and res.stdout.strip() == "ok":
                alive += 1
                continue
            errors.append(f"{sb.sandbox_id}: exit {res.exit_code}, {res.stderr.strip()[:200]}")
        except Exception as exc:  # noqa: BLE001 - a dead sandbox is a finding
            errors.append(f"{sb.sandbox_id}: {type(exc).__name__}: {exc}")
    return alive, errors


def exec_sample(sb: Sandbox, runs: int) -> dict[str, float]:
    samples: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        sb.commands.run("true")
        samples.append((time.perf_counter() - start) * 1000)
    return summary(samples)


# report -----------------------------------------------------------------------------------
def _get(d: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _verdict(value: float, target: float, *, at_most: bool = True) -> str:
    if math.isnan(value):
        return "-"
    ok = value <= target if at_most else value >= target
    return "ok" if ok else f"MISSED ({value / target:.1f}x target)" if at_most else "MISSED"


def _ms_row(name: str, stats: Any, target: float | None = None, extra: str = "") -> list[str]:
    if not isinstance(stats, dict) or "p50" not in stats:
        reason = stats.get("skipped") if isinstance(stats, dict) else None
        return [name, "-", "-", "-", "-", f"skipped: {reason}" if reason else "not measured"]
    p50 = _num(stats["p50"])
    tgt = f"p50 <= {fmt_ms(target)}" if target is not None else ""
    note = _verdict(p50, target) if target is not None else extra
    return [name, fmt_ms(p50), fmt_ms(_num(stats["p95"])), str(stats["n"]), tgt, note]


def ratio_lines(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    floor = _num(_get(r, "floor", "p50"))
    if not math.isnan(floor):
        ratio = _num(_get(r, "create_cold", "create", "p50")) / floor
        ok = "ok" if ratio <= TARGET_CREATE_VS_FLOOR else "MISSED"
        lines.append(f"cold create is {fmt_ratio(ratio)} a bare runc run of a no-op "
                     f"(target <= {TARGET_CREATE_VS_FLOOR:g}x: {ok})")
    exec_p50 = _num(_get(r, "exec", "p50"))
    cold = _num(_get(r, "create_cold", "cycle", "p50"))
    pooled = _num(_get(r, "create_pooled", "cycle", "p50"))
    rl_create = _num(_get(r, "rootless", "create_cold", "create", "p50"))
    rl_exec = _num(_get(r, "rootless", "exec", "p50"))
    if not math.isnan(rl_create):
        root_create = _num(_get(r, "create_cold", "create", "p50"))
        lines.append(f"rootless create is {fmt_ratio(rl_create / root_create)} root's, "
                     f"rootless exec {fmt_ratio(rl_exec / exec_p50)} root's")
    for peer, label in (("bwrap", "a bwrap one-shot"), ("podman", "a podman run --rm")):
        base = _num(_get(r, "peers", peer, "p50"))
        if math.isnan(base):
            reason = _get(r, "peers", peer, "skipped") or "not measured"
            lines.append(f"vs {label}: skipped ({reason})")
            continue
        if peer == "bwrap":
            lines.append(f"exec round trip is {fmt_ratio(exec_p50 / base)} {label}")
        lines.append(f"cold create+exec+kill is {fmt_ratio(cold / base)} {label}")
        if not math.isnan(pooled):
            lines.append(f"pooled create+exec+kill is {fmt_ratio(pooled / base)} {label}")
    return lines


def render(r: dict[str, Any]) -> str:
    rows: list[list[str]] = [["create (base template, returns ready for exec)"]]
    rows.append(_ms_row("create, cold (no pool)", _get(r, "create_cold", "create"),
                        TARGET_CREATE_P50_MS))
    pooled = r.get("create_pooled")
    if isinstance(pooled, dict) and "create" in pooled:
        rows.append(_ms_row(f"create, pooled (pool of {pooled['pool_size']}, hit)",
                            pooled["create"], TARGET_CREATE_P50_MS))
    else:
        rows.append(_ms_row("create, pooled", pooled))
    rows.append(_ms_row("first exec after create (cold)", _get(r, "create_cold", "first_exec")))
    rows.append(_ms_row("kill (cold, delete volume)", _get(r, "create_cold", "kill")))
    rows.append(_ms_row("create+exec+kill, cold", _get(r, "create_cold", "cycle")))
    if isinstance(pooled, dict) and "cycle" in pooled:
        rows.append(_ms_row("create+exec+kill, pooled", pooled["cycle"], None,
                            "kill overlaps pool refill"))
    rows.append(["exec (SDK commands.run('true'), warm)"])
    rows.append(_ms_row("exec round trip, 1 sandbox", r.get("exec"), TARGET_EXEC_P50_MS))
    fleet = r.get("fleet") or {}
    k = fleet.get("k", r["params"]["sandboxes"])
    rows.append(_ms_row(f"exec round trip, {fleet.get('created', k)} alive",
                        fleet.get("exec_with_fleet"), TARGET_EXEC_P50_MS))
    rows += memory_rows(fleet, r["params"]["idle_s"])
    rows += density_rows(fleet, k)
    rows += rootless_rows(r)
    rows.append(["peers (one-shot processes)"])
    rows.append(_ms_row("floor: bare runc run (busybox true)", r.get("floor")))
    rows.append(_ms_row("bwrap --unshare-all ... true", _get(r, "peers", "bwrap")))
    rows.append(_ms_row("podman run --rm (runc, busybox) true", _get(r, "peers", "podman")))
    text = table(["figure", "p50 / value", "p95", "n", "target", "verdict / note"], rows,
                 title="agent_sandbox engine benchmark")
    text += "\n\nratios (p50 / p50):\n" + "\n".join(f"  {x}" for x in ratio_lines(r))
    text += "\n\n" + footer(r)
    return text


def rootless_rows(r: dict[str, Any]) -> list[list[str]]:
    rl = r.get("rootless")
    rows: list[list[str]] = [["rootless engine (a plain user, same cycle, next to root's)"]]
    if not isinstance(rl, dict) or "create_cold" not in rl:
        return rows + [_ms_row("rootless", rl)]
    root_create = _num(_get(r, "create_cold", "create", "p50"))
    root_exec = _num(_get(r, "exec", "p50"))
    vs = [f"root: {fmt_ms(root_create)}", f"root: {fmt_ms(root_exec)}"]
    rows.append(_ms_row("create, cold (rootless)", rl["create_cold"]["create"], None, vs[0]))
    rows.append(_ms_row("first exec after create (rootless)", rl["create_cold"]["first_exec"]))
    rows.append(_ms_row("kill (rootless, delete volume)", rl["create_cold"]["kill"]))
    rows.append(_ms_row("create+exec+kill (rootless)", rl["create_cold"]["cycle"]))
    rows.append(_ms_row("exec round trip (rootless)", rl["exec"], None, vs[1]))
    return rows


def memory_rows(fleet: dict[str, Any], idle: float) -> list[list[str]]:
    mem = fleet.get("memory")
    n = fleet.get("created", 0)
    rows: list[list[str]] = [[f"memory per idle sandbox ({n} alive, idle {idle:g} s)"]]
    if not mem:
        return rows + [["memory", "-", "-", "-", "-", "not measured"]]
    tgt = f"<= {fmt_mb(TARGET_IDLE_BYTES)}"
    for key, label, note in (
        ("per_sandbox_mem_available", "(a) host MemAvailable drop / K", "host-wide, noisy"),
        ("per_sandbox_pss", "(b) PSS of sandbox processes / K",
         f"{mem['processes_per_sandbox']:.1f} processes each"),
        ("per_sandbox_cgroup", "(c) cgroup memory.usage_in_bytes / K", "kernel-side charge"),
    ):
        value = _num(mem[key])
        verdict = "ok" if value <= TARGET_IDLE_BYTES else \
            f"MISSED ({value / TARGET_IDLE_BYTES:.1f}x target)"
        rows.append([label, fmt_mb(value), "", str(mem["n"]), tgt, f"{verdict}; {note}"])
    if mem["missing_pid"] or mem["missing_cgroup"]:
        rows.append(["(missing pid / cgroup)", f"{mem['missing_pid']} / {mem['missing_cgroup']}",
                     "", "", "", "not counted"])
    return rows


def density_rows(fleet: dict[str, Any], k: int) -> list[list[str]]:
    rows: list[list[str]] = [[f"density ({k} sandboxes at once)"]]
    if not fleet:
        return rows + [["alive", "-", "-", "-", "-", "not measured"]]
    created = fleet.get("created", 0)
    if "alive" in fleet:
        alive = fleet["alive"]
        value, verdict = f"{alive}/{k}", _verdict(float(alive), TARGET_ALIVE, at_most=False)
    else:
        value, verdict = "-", f"not measured ({created} created)"
    if fleet.get("create_error"):
        verdict += f"; creates stopped at {created}: see below"
    rows.append([f"alive: answers echo ok (of {k})", value, "", "", f">= {TARGET_ALIVE}",
                 verdict])
    rows.append([f"time to create all {fleet.get('created', 0)}",
                 f"{_num(fleet.get('create_all_s')):.1f} s", "", "", "", ""])
    rows.append(_ms_row("create while filling up (all)", fleet.get("create_latency")))
    rows.append(_ms_row("create while filling up (last 10%)",
                        fleet.get("create_latency_last10pct")))
    if "kill_all_s" in fleet:
        rows.append([f"time to kill all {fleet['created']}", f"{fleet['kill_all_s']:.1f} s",
                     "", "", "", ""])
    return rows


def footer(r: dict[str, Any]) -> str:
    h = r["host"]
    lines = [f"host: {h['cpus']} CPUs, {h['mem_total_mb']} MB RAM, kernel {h['kernel']}, "
             f"{h['runc']}, python {h['python']}",
             "create = Sandbox.create() until it returns (the engine waits for the guest's "
             "ping, so it is ready for exec); peers are timed from Python's subprocess.run, "
             "as the SDK's own exec includes Python.",
             f"fleet sandboxes have {FLEET_DISK_MB} MB disks: every block of a disk is "
             "allocated on the host, so K default disks would need K GB free."]
    fleet = r.get("fleet") or {}
    if fleet.get("create_error"):
        lines.append(f"fleet create error: {fleet['create_error']}")
    for err in (fleet.get("alive_errors") or [])[:5]:
        lines.append(f"not alive: {err}")
    if fleet.get("limits_after"):
        lines.append("host limits after the fleet: " + ", ".join(
            f"{k}={v}" for k, v in fleet["limits_after"].items()))
    if r.get("error"):
        lines.append(f"run aborted: {r['error']}")
    if r.get("interrupted"):
        lines.append("run interrupted (Ctrl-C): figures above are partial")
    return "\n".join(lines)


def _as_json(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def rootless_child(args: argparse.Namespace) -> int:
    """``--rootless-child``: the rootless phase, run by the user the main run made."""
    if os.geteuid() == 0:
        print("--rootless-child runs as an unprivileged user", file=sys.stderr)
        return 2
    bench = Bench(args)
    try:
        bench.run_rootless_child()
        bench.results["engine"] = bench.default_engine().engine_info()
    finally:
        bench.cleanup()
    print(json.dumps(_as_json(bench.results)))
    return 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rootless_child:
        return rootless_child(args)
    if os.geteuid() != 0:
        print("bench/engine.py needs root (the engine mounts overlays and runs runc; it "
              "runs the rootless phase as a user it makes)", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
    bench = Bench(args)
    status = 0
    try:
        bench.run()
    except KeyboardInterrupt:
        progress("interrupted: cleaning up")
        bench.results["interrupted"] = True
        status = 130
    except Exception as exc:  # noqa: BLE001 - report what was measured, then the error
        traceback.print_exc()
        bench.results["error"] = f"{type(exc).__name__}: {exc}"
        status = 1
    finally:
        progress("cleaning up")
        bench.cleanup()
    r = bench.results
    r["targets"] = {"create_p50_ms": TARGET_CREATE_P50_MS,
                    "create_vs_floor": TARGET_CREATE_VS_FLOOR, "exec_p50_ms": TARGET_EXEC_P50_MS,
                    "idle_bytes_per_sandbox": TARGET_IDLE_BYTES, "alive": TARGET_ALIVE}
    r["ratios"] = ratio_lines(r)
    print(json.dumps(_as_json(r), indent=2) if args.json else render(r))
    return status


if __name__ == "__main__":
    sys.exit(main())
