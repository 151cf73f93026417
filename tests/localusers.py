"""Real unprivileged local users for the tests that run the product as a non-root user.

Users are created with ``useradd`` (Debian's adds /etc/subuid ranges) and commands run as
them through ``setpriv`` with a clean environment. The checkout and its Python must be
reachable by them: ancestors that others cannot traverse get o+x for the session only.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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

    def _open_path_for_others(self) -> None:
        """Let other users traverse to the checkout and the interpreter (session only)."""
        if self._opened:
            return
        targets = {REPO, Path(os.path.realpath(sys.executable)).parent}
        for target in targets:
            for folder in [target, *target.parents]:
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH:
                    os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXOTH)
                    self._opened.append((folder, stat.S_IMODE(mode)))

    def cleanup(self) -> None:
        for user in self._made:
            subprocess.run(["pkill", "-KILL", "-u", str(user.uid)], capture_output=True)
        for user in self._made:
            subprocess.run(["userdel", "--remove", "--force", user.name], capture_output=True)
        for folder, mode in reversed(self._opened):
            os.chmod(folder, mode)
        self._made.clear()
        self._opened.clear()
