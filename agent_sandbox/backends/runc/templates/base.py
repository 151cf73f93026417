"""The built-in ``base`` template: the host OS seen from a sandbox.

As root, a view: a small skeleton for ``/`` (fresh /tmp /root /home /var), the host's
``/usr`` and a snapshot of the host's ``/etc`` holding only what every host user may read.
Rootless, the same skeleton and snapshot over a user-owned copy of part of the host's /usr
(``rootless_base``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_sandbox.backends.runc.host.mode import RESOLV_CONF
from agent_sandbox.core.templates import BASE, Layer, Template

_USR_MERGED_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Host files always hidden, whatever their mode.
_ALWAYS_MASKED = ("shadow", "shadow-", "gshadow", "gshadow-", "machine-id")
DEFAULT_UID = 1000  # the guest's users.DEFAULT_UID
# Part of a snapshot's name: a change in how snapshots are made gives new ones.
_SNAPSHOT_RECIPE = b"abx-etc-2 (uid 1000 is user)\n"


def host_view_base(folder: Path) -> Template:
    """Root: the host's /usr (and its unmerged /bin, /lib...) as read-only lowers."""
    skeleton = _skeleton(folder, merged=False)
    etc = _ensure_etc_snapshot(folder)
    layers = [Layer("/", [str(skeleton)]), Layer("/usr", ["/usr"]), Layer("/etc", [str(etc)])]
    for name in _USR_MERGED_DIRS:
        host = Path("/") / name
        if host.is_dir() and not host.is_symlink():
            layers.append(Layer(f"/{name}", [str(host)]))
    return Template(
        name=BASE, kind="base", layers=layers, created_at=skeleton.stat().st_mtime,
        description="A view of the host OS: its /usr and /etc (secrets masked), "
                    "fresh /tmp /root /home /var",
    )


def user_copy_base(folder: Path) -> Template:
    """Rootless: a user-owned copy of part of the host (the user cannot idmap views)."""
    from agent_sandbox.backends.runc.templates import rootless_base

    # The copy of /usr is most of the work (a new user's first call waits for it): the
    # skeleton and /etc are made meanwhile.
    with ThreadPoolExecutor(1, thread_name_prefix="abx-base") as pool:
        side = pool.submit(lambda: (_skeleton(folder, merged=True),
                                    _ensure_etc_snapshot(folder)))
        usr = rootless_base.ensure_usr(folder)
        skeleton, etc = side.result()
    return Template(
        name=BASE, kind="base", created_at=skeleton.stat().st_mtime,
        layers=[Layer("/", [str(skeleton)]), Layer("/usr", [str(usr)]),
                Layer("/etc", [str(etc)])],
        description="A copy of part of the host OS (shells, coreutils, python3, pip, "
                    "apt) and its /etc (secrets masked), fresh /tmp /root /home /var",
    )


def _skeleton(folder: Path, *, merged: bool) -> Path:
    skeleton = folder / "skeleton"
    if not skeleton.exists():
        _build_skeleton(folder, skeleton, merged=merged)
    return skeleton


def _build_skeleton(folder: Path, skeleton: Path, *, merged: bool = False) -> None:
    """``merged``: /bin, /lib, ... are links into /usr whatever the host does (the
    rootless base copies everything into its /usr)."""
    # Unique per thread and process: a pool thread and a create may both get here.
    tmp = folder / f".skeleton.tmp{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    dirs = {"usr": 0o755, "etc": 0o755, "tmp": 0o1777, "root": 0o700, "home": 0o755,
            "var": 0o755, "var/tmp": 0o1777, "var/lib": 0o755, "var/cache": 0o755,
            "var/log": 0o755, "run": 0o755, "proc": 0o555, "sys": 0o555, "dev": 0o755,
            "workspace": 0o755, "opt": 0o755, "mnt": 0o755, "srv": 0o755, "media": 0o755,
            ".abx": 0o755, ".abx/guest": 0o755, ".abx/run": 0o755}
    for rel, mode in dirs.items():
        (tmp / rel).mkdir(exist_ok=True)
        os.chmod(tmp / rel, mode)
    for name in _USR_MERGED_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), tmp / name)
        elif merged and host.is_dir():
            os.symlink(f"usr/{name}", tmp / name)
        elif host.is_dir():
            (tmp / name).mkdir()
    # dpkg's database makes apt and dpkg work on top of the host's /usr. cp: a tenth of
    # shutil.copytree's time for its ~3000 small files (on a new user's first call).
    if Path("/var/lib/dpkg").is_dir():
        # A non-root copy misses the root-only lock files (cp says so and copies the
        # rest): dpkg makes new ones.
        subprocess.run(["cp", "-a", "--no-preserve=ownership", "--", "/var/lib/dpkg",
                        str(tmp / "var/lib/dpkg")], capture_output=True)
    try:
        os.replace(tmp, skeleton)
    except OSError:  # someone else finished first: theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)


def _etc_fingerprint(etc: Path) -> tuple[str, list[tuple[str, os.stat_result]]]:
    """What a snapshot would hold (world-readable entries) and a digest of it."""
    entries: list[tuple[str, os.stat_result]] = []
    digest = hashlib.sha256(_SNAPSHOT_RECIPE)
    for dirpath, dirnames, filenames in os.walk(etc):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, etc)
            secret = not stat.S_ISLNK(st.st_mode) and not st.st_mode & stat.S_IROTH
            if secret or rel in _ALWAYS_MASKED:
                if name in dirnames:
                    dirnames.remove(name)  # a private directory: nothing below is shared
                continue
            entries.append((rel, st))
            digest.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0"
                          f"{st.st_uid}\0{st.st_gid}\n".encode())
    return digest.hexdigest()[:12], entries


def _add_default_user(etc: Path) -> None:
    """The sandboxes' unprivileged account, ``user`` (uid/gid 1000, home /home/user: the
    guest makes the home and gives it /workspace on first use). A host account holding
    id 1000 is left out: in a sandbox that id is ``user``."""
    files = {name: etc / name for name in ("passwd", "group", "shadow")}
    if any(path.is_symlink() for path in files.values()):
        return  # never written through a link (it points into the host): the guest adds it
    uid = str(DEFAULT_UID)
    passwd = _lines(files["passwd"])
    if any(line.split(":")[:1] == ["user"] for line in passwd):
        return
    gone = {line.split(":")[0] for line in passwd if line.split(":")[2:3] == [uid]}
    shell = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
    kept = {
        "passwd": [ln for ln in passwd if ln.split(":")[2:3] != [uid]]
        + [f"user:x:{uid}:{uid}::/home/user:{shell}"],
        "group": [ln for ln in _lines(files["group"]) if ln.split(":")[2:3] != [uid]]
        + [f"user:x:{uid}:"],
    }
    if files["shadow"].is_file():
        kept["shadow"] = [ln for ln in _lines(files["shadow"]) if ln.split(":")[0] not in gone]
        kept["shadow"].append("user:!::0:99999:7:::")
    for name, lines in kept.items():
        path = files[name]
        mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o644
        path.write_text("\n".join(lines) + "\n")
        os.chmod(path, mode)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _sanitized(path: Path) -> str:
    """/etc/shadow-like file with every password field locked."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(":")
        if len(parts) > 2:
            parts[1] = "*"
            lines.append(":".join(parts))
    return "\n".join(lines) + "\n"


def _ensure_etc_snapshot(folder: Path) -> Path:
    """A copy of the host's /etc holding only what every host user may read.

    A copy, not a live view: a secret created in the host's /etc later can never show
    up in a sandbox. Versioned by a digest of names, modes, sizes and times: a changed
    /etc gives a new snapshot for new sandboxes; running ones keep theirs.
    """
    etc = Path("/etc")
    digest, entries = _etc_fingerprint(etc)
    snapshot = folder / f"etc-{digest}"
    if snapshot.exists():
        return snapshot
    tmp = folder / f".etc.tmp{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    os.chmod(tmp, 0o755)
    # As a plain user the copy is the user's own (root inside its sandboxes).
    own_ids = os.geteuid() == 0
    for rel, st in entries:
        src, dst = etc / rel, tmp / rel
        try:
            if stat.S_ISDIR(st.st_mode):
                dst.mkdir(exist_ok=True)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(src, dst, follow_symlinks=False)
            else:
                continue  # fifos, sockets, devices: not configuration
            if own_ids:
                os.lchown(dst, st.st_uid, st.st_gid)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(dst, stat.S_IMODE(st.st_mode))
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            continue  # vanished or unreadable meanwhile: leave it out
    for name, source in (("shadow", "passwd"), ("gshadow", "group")):
        if (etc / name).is_file():
            # The real file when readable (root), else the same names from the public one.
            if os.access(etc / name, os.R_OK):
                text = _sanitized(etc / name)
            else:
                tail = ":::::::" if name == "shadow" else "::"
                text = "".join(line.split(":", 1)[0] + ":*" + tail + "\n" for line in
                               (etc / source).read_text(errors="replace").splitlines()
                               if ":" in line)
            (tmp / name).write_text(text)
            os.chmod(tmp / name, 0o640)
    _add_default_user(tmp)
    for name, text in (("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"),
                       # the policy resolver (a read-only mount over it at boot)
                       ("resolv.conf", RESOLV_CONF),
                       ("hostname", "sandbox\n")):
        target = tmp / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.write_text(text)
    try:
        os.replace(tmp, snapshot)
    except OSError:  # another process made the same snapshot first
        shutil.rmtree(tmp, ignore_errors=True)
    return snapshot
