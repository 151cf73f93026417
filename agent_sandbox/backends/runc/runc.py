"""Thin driver for the ``runc`` binary: one container per sandbox, detached."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from agent_sandbox.core.errors import RuntimeUnavailableError


class Runc:
    def __init__(self, state_root: Path, *, systemd_cgroup: bool = False) -> None:
        binary = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin")
        if binary is None:
            raise RuntimeUnavailableError(
                "runc is not installed: run the README's setup command "
                "(or `apt-get install runc`)"
            )
        self.binary = binary
        self.state_root = state_root
        # runc detects rootless mode by itself (euid != 0); its state lives under our
        # data dir either way.
        self._base = [binary, "--root", str(state_root)] + \
            (["--systemd-cgroup"] if systemd_cgroup else [])
        state_root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _run(self, *args: str, check: bool = True, what: str = "", log: Path | None = None,
             **kw: Any) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run([*self._base, *args],
                                  capture_output=True, text=True, **kw)
        except subprocess.TimeoutExpired:
            raise RuntimeUnavailableError(f"runc {what or args[0]} did not finish within "
                                          f"{kw.get('timeout')} s") from None
        if check and proc.returncode != 0:
            detail = proc.stderr.strip() or proc.stdout.strip()
            if log is not None:
                detail = _last_error(log, log.parent) or detail
            raise RuntimeUnavailableError(f"runc {what or args[0]} failed: {detail}")
        return proc

    def run_detached(self, container_id: str, bundle: Path, listener: int, output: int) -> None:
        """Start the container; its pid 1 gets ``listener`` as fd 3 (``--preserve-fds``)
        and ``output`` (a pipe the caller reads, then closes) as stdout and stderr.

        No file the sandbox could reach is opened: the guest's socket is a listener the
        host bound in a host-only directory, and its output never touches a disk.
        posix_spawn, not fork: its dup2 actions put the listener at fd 3 without running
        Python between fork and exec in a threaded process.
        """
        runc_log = bundle / "runc.log"
        argv = [*self._base, "--log", str(runc_log), "run", "--detach", "--preserve-fds", "1",
                "--bundle", str(bundle), container_id]
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = os.posix_spawn(self.binary, argv, dict(os.environ), setsid=True,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, null, 0),
                                               (os.POSIX_SPAWN_DUP2, output, 1),
                                               (os.POSIX_SPAWN_DUP2, output, 2),
                                               (os.POSIX_SPAWN_DUP2, listener, 3)])
        finally:
            os.close(null)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            detail = runc_log.read_text(errors="replace")[-1500:] if runc_log.exists() else ""
            raise RuntimeUnavailableError(f"runc run failed: {detail.strip()}")

    def checkpoint(self, container_id: str, criu: str, image_dir: Path, work_dir: Path) -> None:
        """Dump the container's processes and memory into ``image_dir`` and stop it
        (CRIU; loopback TCP kept). On failure CRIU leaves the processes running."""
        self._run("--criu", criu, "--log", str(work_dir / "runc.log"), "checkpoint",
                  "--image-path", str(image_dir), "--work-path", str(work_dir),
                  "--tcp-established", "--file-locks", container_id,
                  timeout=_CRIU_TIMEOUT, what="checkpoint", log=work_dir / "dump.log")

    def restore(self, container_id: str, criu: str, bundle: Path, image_dir: Path,
                work_dir: Path, stdio: int) -> None:
        """Start ``container_id`` from a checkpoint image, detached. ``stdio`` becomes
        runc's stdout and stderr (which CRIU options may hand to the restored processes:
        ``inherit-fd fd[1]:...``)."""
        argv = [*self._base, "--criu", criu, "--log", str(work_dir / "runc.log"), "restore",
                "--detach", "--bundle", str(bundle), "--image-path", str(image_dir),
                "--work-path", str(work_dir), "--tcp-established", "--file-locks",
                container_id]
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = os.posix_spawn(self.binary, argv, dict(os.environ), setsid=True,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, null, 0),
                                               (os.POSIX_SPAWN_DUP2, stdio, 1),
                                               (os.POSIX_SPAWN_DUP2, stdio, 2)])
        finally:
            os.close(null)
        code = _wait(pid, _CRIU_TIMEOUT)
        if code != 0:
            raise RuntimeUnavailableError(
                f"runc restore failed: {_last_error(work_dir / 'restore.log', work_dir)}")

    def state(self, container_id: str) -> dict[str, Any] | None:
        proc = self._run("state", container_id, check=False)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)

    def pause(self, container_id: str) -> None:
        self._run("pause", container_id)

    def resume(self, container_id: str) -> None:
        self._run("resume", container_id)

    def thaw(self, container_id: str) -> None:
        """Resume it if it is frozen; one that runs already is left as it is."""
        self._run("resume", container_id, check=False)

    def delete(self, container_id: str) -> None:
        """Kill and remove, whatever state it is in; absent is fine.

        SIGKILL to the container's pid 1 ends its pid namespace at once; runc 1.1's own
        ``delete --force`` polls for ~100 ms before noticing. A frozen container is
        thawed first, or the kill would wait for the thaw.
        """
        state = self.state(container_id)
        if state is None:
            return
        pid = int(state.get("pid") or 0)
        if state.get("status") == "paused":
            self._run("resume", container_id, check=False)
        if pid > 0 and state.get("status") in ("running", "paused"):
            try:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 2.0
                while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                    if _is_zombie(pid):
                        break
                    time.sleep(0.001)
            except ProcessLookupError:
                pass
        proc = self._run("delete", container_id, check=False)
        if proc.returncode != 0:
            self._run("delete", "--force", container_id, check=False)

    def list_ids(self) -> list[str]:
        return list(self.list_states())

    def list_states(self) -> dict[str, str]:
        """Every container's id and runc status (one runc call for all)."""
        proc = self._run("list", "--format", "json", check=False)
        if proc.returncode != 0 or not proc.stdout.strip():
            return {}
        return {c["id"]: c.get("status", "") for c in json.loads(proc.stdout) or []}


_CRIU_TIMEOUT = 120.0  # a dump or restore of a large sandbox, at most


def _wait(pid: int, timeout: float) -> int:
    """The exit code of child ``pid``; killed past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.002)


def _last_error(log: Path, work_dir: Path) -> str:
    """CRIU's (or runc's) last error lines: host-written logs, read bounded."""
    for path in (log, work_dir / "runc.log"):
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        errors = [x.strip() for x in text.splitlines() if "Error" in x or "error" in x]
        if errors:  # names from the sandbox's processes may be in them: printable only
            return "".join(c if c.isprintable() else "?"
                           for c in " | ".join(errors[-3:])[-1500:])
    return "no error recorded"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True
