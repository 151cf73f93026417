"""Real unprivileged local users for the tests that run the product as a non-root user.

Users are created with ``useradd`` (Debian's adds /etc/subuid ranges) and commands run as
them through ``setpriv`` with a clean environment. The checkout and its Python must be
reachable by them: ancestors that others cannot traverse get o+x for the session only.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Directories opened for other users, and by how many test processes (xdist workers).
_OPENS = Path("/run/abx-test-opened-paths.json")


@contextmanager
def _shared_opens() -> Iterator[dict[str, dict[str, int]]]:
    with open(f"{_OPENS}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            opens = json.loads(_OPENS.read_text())
        except (OSError, ValueError):
            opens = {}
        yield opens
        _OPENS.write_text(json.dumps(opens))

# Run as the user: every sandbox and volume of the user's own (rootless) engine, gone.
_CLEAR_ENGINE = """
from agent_sandbox.providers.local import local_provider
e = local_provider()
for i in e.list():
    e.kill(i.sandbox_id, delete_volume=True)
for v in e.list_volumes():
    e.delete_volume(v.volume_id)
"""


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a login of this user would have, plus ``extra``."""
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
               "PATH": path, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
        if os.environ.get("PYTHONPATH"):  # a checkout the venv does not install: the same
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env.update(extra)
        return env

    def argv(self, argv: list[str]) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                "--", *argv]

    def run(self, argv: list[str], *, env: dict[str, str] | None = None,
            timeout: float = 120, input: str | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv), env=env or self.env(), input=input,
                              capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or str(self.home))

    def popen(self, argv: list[str], *, env: dict[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv), env=env or self.env(),
                                cwd=str(self.home), **kwargs)  # type: ignore[call-overload]

    def python(self) -> str:
        return sys.executable

    def clear_engine(self, env: dict[str, str] | None = None) -> None:
        """Kill the sandboxes and delete the volumes of this user's own engine."""
        self.run([self.python(), "-c", _CLEAR_ENGINE], env=env, timeout=120)


class LocalUsers:
    """Creates users on demand; removes them, their processes and files at the end."""

    def __init__(self) -> None:
        self._made: list[LocalUser] = []
        self._opened: list[tuple[Path, int]] = []

    def missing(self) -> str | None:
        if os.geteuid() != 0:
            return "creating test users needs root"
        for tool in ("useradd", "userdel", "setpriv"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        return None

    def create(self, *, groups: tuple[str, ...] = ()) -> LocalUser:
        name = "abxt" + secrets.token_hex(3)
        argv = ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh"]
        if groups:
            argv += ["--groups", ",".join(groups)]
        subprocess.run([*argv, name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        user = LocalUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
        self._made.append(user)
        self._open_path_for_others()
        return user

    def create_rootless(self) -> LocalUser:
        """A new user whose rootless sandboxes can work; skips the test without runc or
        where the host lacks unprivileged user namespaces."""
        if shutil.which("runc") is None:
            pytest.skip("runc is not installed")
        from agent_sandbox.backends.runc.host import subids

        subids.reserve()  # before useradd: the user's subuids must not be the root engine's
        made = self.create()
        probe = made.run(["unshare", "--user", "--map-root-user", "true"])
        if probe.returncode != 0:
            pytest.skip(f"unprivileged user namespaces do not work here: {probe.stderr.strip()}")
        return made

    def _open_path_for_others(self) -> None:
        """Let other users traverse to the checkout and the interpreter, while any test
        process needs it: parallel workers share one count (under a lock) of who does, and
        the last one out puts the modes back."""
        if self._opened:
            return
        targets = {REPO, Path(os.path.realpath(sys.executable)).parent}
        folders = {f for target in targets for f in (target, *target.parents)}
        with _shared_opens() as opens:
            for folder in sorted(folders):
                key = str(folder)
                mode = stat.S_IMODE(folder.stat().st_mode)
                if key not in opens and not mode & stat.S_IXOTH:
                    os.chmod(folder, mode | stat.S_IXOTH)
                    opens[key] = {"mode": mode, "users": 0}
                if key in opens:
                    opens[key]["users"] += 1
                    self._opened.append((folder, opens[key]["mode"]))

    def cleanup(self) -> None:
        for user in self._made:
            subprocess.run(["pkill", "-KILL", "-u", str(user.uid)], capture_output=True)
        for user in self._made:
            subprocess.run(["userdel", "--remove", "--force", user.name], capture_output=True)
        with _shared_opens() as opens:
            for folder, mode in reversed(self._opened):
                entry = opens.get(str(folder))
                if entry is None:
                    continue
                entry["users"] -= 1
                if entry["users"] <= 0:
                    os.chmod(folder, mode)
                    del opens[str(folder)]
        self._made.clear()
        self._opened.clear()
