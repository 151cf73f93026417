"""The ``base`` template of the rootless engine: a small, user-owned copy of the host OS.

An ordinary user's sandboxes cannot see host /usr through an idmapped mount (that needs
root), and overlay copy-up in a user namespace fails on files it does not own: the
template must be the user's own files. Copying all of /usr is far too much, so this copies
the files of a fixed set of packages (shells, coreutils and the usual text tools, procps,
util-linux, python3 with its standard library and pip, dpkg and apt, all of glibc and
zlib), the shared-library closure of every binary among them, and an empty /usr/local.
Built once per user and host package versions, in ``<data>/templates/base/usr-<digest>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import struct
import subprocess
import time
from pathlib import Path

PACKAGES = (
    "base-files", "bash", "dash", "coreutils", "grep", "sed", "mawk", "gawk", "findutils",
    "diffutils", "tar", "gzip", "bzip2", "xz-utils", "procps", "psmisc", "util-linux",
    "debianutils", "sensible-utils", "libc-bin", "hostname", "less", "ncurses-bin",
    "ncurses-base", "passwd", "login", "ca-certificates", "curl", "wget", "file",
    "libstdc++6", "libgcc-s1", "dpkg", "apt", "python3", "python3-minimal", "python3-pip",
    "python3-setuptools", "python3-wheel", "python3-pkg-resources", "python3-distutils",
    "python3-lib2to3", "python3-venv",
    # All of glibc and zlib, not just what the binaries above link: wheels with bundled
    # native code (pyzmq needs librt) count on every distro having them.
    "libc6", "zlib1g",
)
_SKIP = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
         "/usr/share/lintian/", "/usr/lib/python3.11/test/")
_RECIPE = 3
_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _python_packages() -> list[str]:
    """python3.X, python3.X-minimal and their libraries for the host's python3."""
    name = os.path.basename(os.path.realpath("/usr/bin/python3"))
    if not re.fullmatch(r"python3\.\d+", name):
        return []
    return [name, f"{name}-minimal", f"lib{name}-minimal", f"lib{name}-stdlib"]


def _installed(packages: list[str]) -> list[str]:
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Status}\n",
                           *packages], capture_output=True, text=True)
    return [line.split("\t")[0] + "=" + line.split("\t")[1]
            for line in proc.stdout.splitlines() if line.endswith("install ok installed")]


def _to_usr(path: str) -> str | None:
    """The /usr path of a package file (``/bin/sh`` on a merged-/usr host is
    ``/usr/bin/sh``; on an unmerged one it is placed there too)."""
    head, _, tail = path.lstrip("/").partition("/")
    if head in _TOP_DIRS and tail:
        return f"/usr/{head}/{tail}"
    return path if head == "usr" and tail else None


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _elf_deps(path: str) -> tuple[str | None, list[str]]:
    """(PT_INTERP, DT_NEEDED sonames) of a 64-bit little-endian ELF file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None, []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None, []
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    entsize, count = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic, interp = [], None, None
    for i in range(count):
        p_type, _flags, offset, vaddr, _pa, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * entsize)
        if p_type == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
        elif p_type == 3:  # PT_INTERP
            interp = data[offset:offset + filesz].rstrip(b"\0").decode()
    if dynamic is None:
        return interp, []
    needed, strtab = [], None
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            needed.append(value)
        elif tag == 5:  # DT_STRTAB (a virtual address)
            strtab = next((value - va + off for va, off, size in loads
                           if va <= value < va + size), None)
    if strtab is None:
        return interp, []
    names = [data[strtab + n:data.index(b"\0", strtab + n)].decode() for n in needed]
    return interp, names


def _library_dirs() -> list[str]:
    dirs = []
    for conf in sorted(Path("/etc/ld.so.conf.d").glob("*.conf")):
        try:
            dirs += [ln.strip() for ln in conf.read_text().splitlines()
                     if ln.strip().startswith("/")]
        except OSError:
            continue
    return [*dirs, "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64",
            "/usr/lib", "/lib"]


def _library_closure(binaries: list[str]) -> set[str]:
    """Every shared library (and loader) the binaries need, transitively."""
    dirs = _library_dirs()
    found: set[str] = set()
    todo = list(binaries)
    seen_names: set[str] = set()
    while todo:
        interp, names = _elf_deps(todo.pop())
        if interp and interp not in found:
            found.add(interp)
        for name in names:
            if name in seen_names:
                continue
            seen_names.add(name)
            for folder in dirs:
                candidate = os.path.join(folder, name)
                if os.path.exists(candidate):
                    found.add(candidate)
                    todo.append(os.path.realpath(candidate))
                    break
    return found


library_closure = _library_closure  # for templates that add binaries (code_interpreter)


def _source_of(usr_path: str) -> str:
    """Where a /usr path lives on the host (an unmerged host keeps /bin apart)."""
    if os.path.lexists(usr_path):
        return usr_path
    rest = usr_path[len("/usr"):]
    return rest if os.path.lexists(rest) else usr_path


def _copy_one(src: str, dst: str) -> None:
    if os.path.lexists(dst):
        return  # done
    try:
        st = os.lstat(src)
    except OSError:
        return
    try:
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(st.st_mode):
            os.makedirs(dst, exist_ok=True)
            os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o1777 | 0o700)
        elif stat.S_ISREG(st.st_mode):
            shutil.copyfile(src, dst)
            # No setuid/setgid: the sandbox's root needs neither, and no_new_privs is on.
            os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o777 | 0o600)
            # Times kept: bytecode is checked against its source's mtime.
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        if not os.path.isdir(dst) and os.path.lexists(dst):
            os.unlink(dst)


def digest() -> str:
    versions = _installed([*PACKAGES, *_python_packages()])
    text = f"{_RECIPE}\n" + "\n".join(sorted(versions))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def ensure_usr(folder: Path) -> Path:
    """The copied /usr for this host's package versions, built if missing."""
    target = folder / f"usr-{digest()}"
    if target.exists():
        return target
    tmp = folder / f".usr.tmp{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    try:
        _build(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build(usr_root: Path) -> None:
    """Fill ``usr_root`` (which becomes /usr) from the host."""
    packages = [p.split("=")[0] for p in _installed([*PACKAGES, *_python_packages()])]
    listing = subprocess.run(["dpkg", "-L", *packages], capture_output=True, text=True)
    wanted: dict[str, str] = {}  # /usr path -> host source
    for line in listing.stdout.splitlines():
        usr = _to_usr(line.strip()) if line.startswith("/") else None
        if usr and not usr.startswith(_SKIP):
            wanted[usr] = _source_of(usr)
    _add_bytecode(wanted)
    binaries = [src for src in wanted.values()
                if os.path.isfile(src) and not os.path.islink(src) and _is_elf(src)]
    for lib in _library_closure(binaries):
        for path in (lib, os.path.realpath(lib)):
            usr = _to_usr(path)
            if usr:
                wanted.setdefault(usr, _source_of(usr))
    inside = os.path.realpath(usr_root) + "/"
    safe: dict[str, bool] = {}  # parent directory -> inside the tree (checked once each)
    # Sorted: a directory (or a symlink to one) is copied before anything below it.
    for usr in sorted(wanted):
        rel = usr[len("/usr"):].lstrip("/")
        parent = os.path.dirname(rel)
        if parent not in safe:
            _copy_parents(usr_root, rel)
            safe[parent] = (os.path.realpath(os.path.join(usr_root, parent)) + "/"
                            ).startswith(inside)
        if safe[parent]:  # never write through a copied symlink out of the tree
            _copy_one(wanted[usr], os.path.join(usr_root, rel))
    for rel in ("local/bin", "local/sbin", "local/lib", "local/share", "local/include",
                "local/src", "lib/python3/dist-packages", "share"):
        (usr_root / rel).mkdir(parents=True, exist_ok=True)
    os.chmod(usr_root, 0o755)


def _add_bytecode(wanted: dict[str, str]) -> None:
    """The host's compiled bytecode next to each copied module (made by postinst, not
    listed by dpkg): without it every sandbox compiles the stdlib into its system layer."""
    by_dir: dict[str, set[str]] = {}
    for usr in wanted:
        if usr.endswith(".py"):
            folder, _, name = usr.rpartition("/")
            by_dir.setdefault(folder, set()).add(name[:-3])
    for folder, stems in by_dir.items():
        cache = os.path.join(folder, "__pycache__")
        try:
            names = os.listdir(cache)
        except OSError:
            continue
        for name in names:
            if name.endswith(".pyc") and name.split(".", 1)[0] in stems:
                wanted.setdefault(f"{cache}/{name}", f"{cache}/{name}")


def _copy_parents(usr_root: Path, rel: str) -> None:
    """Real directories for every parent (never symlinks: a copied symlink to an absolute
    host path would send later copies out of the tree)."""
    parent = (usr_root / rel.lstrip("/")).parent
    if not parent.is_dir():
        parent.mkdir(parents=True, exist_ok=True)
