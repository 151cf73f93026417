"""The ``code-interpreter-v1`` template: ``base`` plus a Python environment with a kernel.

The environment is a venv made from the host's ``/usr/bin/python3`` (the interpreter every
``base`` sandbox sees at the same path), with ``ipykernel`` and a data stack installed from
the package registry. It lives in the template's directory as ``rootfs-*/opt/abx-python``,
an extra lower directory under the skeleton of ``/``: inside a sandbox it is
``/opt/abx-python``, and ``pip install x`` there writes into the sandbox's system layer
(gone after ``reset_rootfs``).

A venv holds absolute paths only in script shebangs and activation scripts; after the
build they are rewritten from the build path to ``/opt/abx-python`` (the interpreter
itself finds its prefix from ``pyvenv.cfg`` next to ``bin/python``, wherever mounted).

Built by ``python -m agent_sandbox.backends.runc.templates.code_interpreter`` or
``abx template build code-interpreter-v1`` (the setup script runs it), or on the first
``create(template="code-interpreter-v1")``. Root builds it once for every user of the host,
in the shared templates directory (``shared_templates.py``); an ordinary user uses that one
and builds a copy of its own only when there is none. The build inputs (package list,
Python version, recipe version) are recorded; the same inputs reuse the built template. A
build whose package index does not answer fails within seconds, naming the index.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent_sandbox.backends.runc.templates import package_index
from agent_sandbox.backends.runc.templates.shared import seal_tree
from agent_sandbox.backends.runc.templates.store import TemplateStore
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.inside import DEFAULT_PATH
from agent_sandbox.core.templates import BASE, CODE_INTERPRETER, Layer, Template

NAME = CODE_INTERPRETER
ENV_TARGET = "/opt/abx-python"
# e2b_charts: E2B's own chart extraction (``result.chart``, service/code/formatters.py).
# matplotlib 3.10, as E2B's template pins it: code written for E2B's sandboxes passes
# arguments 3.11 removed (``boxplot(labels=...)`` in E2B's own chart tests).
PACKAGES = ("ipykernel", "numpy", "pandas", "matplotlib>=3.10,<3.11", "bash_kernel",
            "e2b_charts")
HOST_PYTHON = "/usr/bin/python3"
# JavaScript and TypeScript: Deno's own Jupyter kernel, its binary from the npm registry's
# ``deno`` package (an optional dependency per platform), where the host has npm.
DENO_PACKAGE = "deno@2"
DENO_TARGET = "/opt/abx-deno/bin/deno"
# R: Debian's R and IRkernel, the packages this host lacks of them unpacked into the
# template's layer (no maintainer scripts run), where the host has apt.
R_PACKAGES = ("r-base-core", "r-cran-irkernel")
_RECIPE = 6  # bump when the build steps change: a different recipe is a different template
_CHECK = ("import ipykernel, matplotlib_inline, numpy, pandas, matplotlib, bash_kernel, "
          "e2b_charts; print('ok')")
_PIP_TIMEOUT = 1800
LineFn = Callable[[str], None]
# R's Debian packages go to /usr and /etc, which base mounts apart: each a tree of its own
# beside the environment's root, named after it (rootfs-<id><suffix>).
_SUBTREES = {"usr": "1", "etc": "2"}

_DENO_KERNEL = {
    # Deno's kernel binds TCP only: on the sandbox's own loopback (kernels.py).
    "argv": [DENO_TARGET, "jupyter", "--kernel", "--conn", "{connection_file}"],
    "env": {"NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"},
    "transport": "tcp",
}
KERNEL = {
    "language": "python",
    "argv": [f"{ENV_TARGET}/bin/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    # The inline backend turns every figure left open at the end of a cell into image/png.
    "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYTHONUNBUFFERED": "1"},
    # The other languages (core/code_languages.py) this template has a kernel for.
    "languages": {
        "bash": {"argv": [f"{ENV_TARGET}/bin/python", "-m", "bash_kernel", "-f",
                          "{connection_file}"]},
    },
}


R_HOST_LIBS = "/usr/lib/R/abx-host-lib"
_R_KERNEL = {
    # IRkernel's own command; its ZeroMQ binding takes TCP addresses only.
    "argv": ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"],
    # After R's own (R puts its lib and the host's library directory first): the copies
    # of host libraries a base without them (rootless, Kubernetes images) lacks.
    "env": {"LD_LIBRARY_PATH": R_HOST_LIBS},
    "transport": "tcp",
}


def kernel(inputs: dict[str, object], with_r: bool = False) -> dict[str, object]:
    """The template's kernels for what it was built with (Deno only where npm was, R
    where its packages could be had)."""
    out = json.loads(json.dumps(KERNEL))
    if inputs.get("deno"):
        out["languages"].update(javascript=dict(_DENO_KERNEL), typescript=dict(_DENO_KERNEL))
    if with_r:
        out["languages"]["r"] = dict(_R_KERNEL)
    return out


@functools.cache
def host_python_version() -> str:
    try:
        out = subprocess.run([HOST_PYTHON, "-c", "import platform; "
                              "print(platform.python_version())"],
                             capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeUnavailableError(
            f"{NAME} needs the host's {HOST_PYTHON} (apt-get install python3 python3-venv): "
            f"{exc}") from None
    return out.stdout.strip()


def build_inputs(packages: tuple[str, ...] = PACKAGES) -> dict[str, object]:
    return {"packages": list(packages), "python": host_python_version(),
            "python_path": HOST_PYTHON, "recipe": _RECIPE,
            "deno": DENO_PACKAGE if shutil.which("npm") else None,
            "r": list(R_PACKAGES) if shutil.which("apt-get") and shutil.which("dpkg-deb")
            else None}


def _stderr_line(line: str) -> None:
    print(f"[{NAME}] {line}", file=sys.stderr, flush=True)


def _own_layers(env_root: str, built: Path | None = None) -> list[Layer]:
    """The template's own layers: the environment's root at ``/``, and the trees of R's
    packages at ``/usr`` and ``/etc``. ``built``: where that root is until the build is
    committed."""
    where = built or Path(env_root)
    return [Layer("/", [env_root])] + [
        Layer(f"/{sub}", [f"{env_root}{suffix}"]) for sub, suffix in _SUBTREES.items()
        if where.with_name(where.name + suffix).is_dir()]


def _layers(store: TemplateStore, env_root: str, built: Path | None = None) -> list[Layer]:
    """base's layers, with the template's own as their top lowers."""
    own = {layer.target: layer.lowers for layer in _own_layers(env_root, built)}
    return [Layer(layer.target, [*own.get(layer.target, []), *layer.lowers])
            for layer in store.ensure_base().layers]


def _env_root(tmpl: Template) -> str:
    return tmpl.layers[0].lowers[0]


def ensure(store: TemplateStore, *, index_url: str = "",
           progress: LineFn | None = _stderr_line, force: bool = False) -> Template:
    """The template, built if missing or built from other inputs; cheap when up to date.

    The host's shared one first; then, for an ordinary user, the user's own. Root builds
    into the shared directory, anyone else into its own store. Also follows base: a
    changed host /etc gives base a new snapshot, and the template's layers are refreshed
    to it (the environment is not rebuilt)."""
    inputs = build_inputs()
    say = progress or (lambda _line: None)
    builds_shared = store.shared is not None and store.shared.builder
    if not force:
        tmpl = _current_anywhere(store, inputs, builds_shared, say)
        if tmpl is not None:
            return tmpl
    root = store.shared.prepare_root() if builds_shared and store.shared else store.root
    with open(root / f".{NAME}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per host; the others wait and reuse
        if not force:
            tmpl = _current_anywhere(store, inputs, builds_shared, say)
            if tmpl is not None:
                return tmpl
        url = package_index.index_url(index_url)
        problem = package_index.unreachable(url)
        if problem is not None:
            raise RuntimeUnavailableError(unreachable_message(url, problem))
        return _build(store, root, inputs, index_url.strip(), say)


def unreachable_message(url: str, problem: str) -> str:
    return (f"{NAME} (the Python kernel run_code needs) is not built on this host and "
            f"cannot be built now: its package index {url} is unreachable ({problem}). "
            f"Build it from an index this host can reach: `abx template build {NAME} "
            f"--index-url URL` (or set ABX_TEMPLATE_INDEX_URL; run as root, it is built "
            "once for every user of the host)")


def _current_anywhere(store: TemplateStore, inputs: dict[str, object], builds_shared: bool,
                      say: LineFn) -> Template | None:
    shared = _current_shared(store, inputs, say)
    if shared is not None or builds_shared:
        return shared  # root's own older copies are not used once it builds for everyone
    return _current(store, inputs)


def _current_shared(store: TemplateStore, inputs: dict[str, object], say: LineFn
                    ) -> Template | None:
    from agent_sandbox.backends.runc.templates.shared import Untrusted

    if store.shared is None:
        return None
    try:
        raw = store.shared.check(NAME)
    except FileNotFoundError:
        return None
    except Untrusted as exc:
        say(f"not using the shared {NAME}: {exc}")
        return None
    if raw.build_inputs != inputs or not raw.layers or not raw.layers[0].lowers:
        return None
    if not Path(_env_root(raw), ENV_TARGET.lstrip("/"), "pyvenv.cfg").exists():
        return None
    return store.compose_shared(raw)


def _current(store: TemplateStore, inputs: dict[str, object]) -> Template | None:
    meta = store.path(NAME) / "template.json"
    if not meta.exists():
        return None
    tmpl = Template.from_json(json.loads(meta.read_text()))
    if tmpl.build_inputs != inputs or not tmpl.layers or not tmpl.layers[0].lowers:
        return None
    root = _env_root(tmpl)
    if not Path(root, ENV_TARGET.lstrip("/"), "pyvenv.cfg").exists():
        return None
    layers = _layers(store, root)
    if layers != tmpl.layers:
        tmpl.layers = layers
        store.save(tmpl)
    return tmpl


def _run(argv: list[str], progress: LineFn, what: str, env: dict[str, str] | None = None
         ) -> list[str]:
    """Run a build step, streaming its output lines to ``progress``; returns the lines."""
    lines: list[str] = []
    # umask 022: what root builds for everyone must be readable by everyone.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, umask=0o022)
    assert proc.stdout is not None
    deadline = time.monotonic() + _PIP_TIMEOUT
    for raw in proc.stdout:
        line = raw.rstrip()
        if line:
            lines.append(line)
            progress(line)
        if time.monotonic() > deadline:
            proc.kill()
    if proc.wait() != 0:
        tail = "\n".join(lines[-15:])
        hint = ""
        if any(s in tail for s in ("No matching distribution", "Could not find a version",
                                   "NewConnectionError", "Network is unreachable",
                                   "Temporary failure in name resolution", "ConnectTimeout",
                                   "Max retries exceeded")):
            hint = ("\nThe package registry could not be reached. Give this host access to "
                    f"it, or build from a reachable index or mirror: `abx template build "
                    f"{NAME} --index-url URL` (or ABX_TEMPLATE_INDEX_URL).")
        raise RuntimeUnavailableError(f"building template {NAME} failed at {what} "
                                      f"(exit {proc.returncode}):\n{tail}{hint}")
    return lines


def _build(store: TemplateStore, root: Path, inputs: dict[str, object], index_url: str,
           progress: LineFn) -> Template:
    """Build into ``root``: the shared directory (root) or the store's own."""
    started = time.monotonic()
    shared = root != store.root
    staging = root / f".tmp-{NAME}-{os.getpid()}-{time.time_ns()}"
    staging.mkdir(mode=0o755)
    try:
        rootfs = staging / f"rootfs-{time.time_ns():x}"
        env_dir = rootfs / ENV_TARGET.lstrip("/")
        env_dir.parent.mkdir(parents=True)
        for path in (rootfs, env_dir.parent):
            os.chmod(path, 0o755)
        packages = [str(p) for p in inputs["packages"]]  # type: ignore[attr-defined]
        progress(f"creating a Python {inputs['python']} environment for {ENV_TARGET}")
        _run([HOST_PYTHON, "-m", "venv", str(env_dir)], progress, "python3 -m venv")
        progress(f"installing {' '.join(packages)} from the package registry")
        pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        pip_env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        index = ["--index-url", index_url] if index_url else []
        _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off",
              *index, *packages], progress, "pip install", env=pip_env)
        _relocate(env_dir, ENV_TARGET)
        if inputs.get("deno"):
            _install_deno(rootfs, staging, str(inputs["deno"]), progress)
        else:
            progress("no npm on this host: JavaScript and TypeScript are left out "
                     "(apt-get install npm, then build again)")
        with_r = bool(inputs.get("r")) and _install_r(rootfs, staging, progress)
        for path in staging.glob(f"{rootfs.name}?"):
            os.chmod(path, 0o755)
        check = subprocess.run([str(env_dir / "bin" / "python"), "-c", _CHECK],
                               capture_output=True, text=True, timeout=300)
        if check.returncode != 0:
            raise RuntimeUnavailableError(f"building template {NAME}: the environment does "
                                          f"not import its packages:\n{check.stderr[-2000:]}")
        final_root = root / NAME / rootfs.name
        # Shared: its own layer only (each engine stacks it on its own base).
        layers = (_own_layers(str(final_root), rootfs) if shared
                  else _layers(store, str(final_root), rootfs))
        tmpl = Template(
            name=NAME, kind="built", layers=layers,
            env={"PATH": f"{ENV_TARGET}/bin:{Path(DENO_TARGET).parent}:{DEFAULT_PATH}",
                 "VIRTUAL_ENV": ENV_TARGET},
            kernel=kernel(inputs, with_r), build_inputs=inputs,
            description=f"{BASE} plus Python {inputs['python']} in {ENV_TARGET} with "
                        f"{', '.join(re.split('[<>=!~]', p)[0] for p in packages)}; "
                        "a Jupyter kernel for run_code",
        )
        (staging / "template.json").write_text(json.dumps(tmpl.to_json(), indent=2))
        if shared:
            seal_tree(staging)  # root's, and nobody else may write any of it
            _commit_shared(staging, root / NAME, rootfs.name)
        else:
            folder = root / NAME
            trash = root / f".trash-{NAME}-{os.getpid()}-{time.time_ns()}"
            if folder.exists():
                os.replace(folder, trash)
            os.replace(staging, folder)
            shutil.rmtree(trash, ignore_errors=True)
        where = f"for every user, in {root}" if shared else f"in {root}"
        progress(f"template {NAME} ready {where} ({time.monotonic() - started:.0f} s)")
        if shared:
            composed = store.compose_shared(tmpl)
            if composed is None:
                raise RuntimeUnavailableError(f"the {NAME} just built in {root} is not "
                                              "root's alone (the server log says why)")
            return composed
        return tmpl
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _commit_shared(staging: Path, folder: Path, rootfs: str) -> None:
    """The new build in place for every user. Other users' sandboxes may still run on
    the previous one (root cannot know): it is kept until the next build, older ones go."""
    previous: set[str] = set()
    try:
        old = json.loads((folder / "template.json").read_text())
        previous = {Path(lower).name for layer in old.get("layers", [])
                    for lower in layer.get("lowers", [])}
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    built = {entry.name for entry in staging.glob(f"{rootfs}*")}  # with R's trees
    for name in built:
        os.replace(staging / name, folder / name)
    os.replace(staging / "template.json", folder / "template.json")  # the switch
    for entry in folder.iterdir():
        if entry.name.startswith("rootfs-") and entry.name not in previous | built:
            trash = folder.parent / f".trash-{NAME}-{os.getpid()}-{time.time_ns()}"
            os.replace(entry, trash)
            shutil.rmtree(trash, ignore_errors=True)


def _install_deno(rootfs: Path, staging: Path, package: str, progress: LineFn) -> None:
    """Deno's binary at ``DENO_TARGET``: npm fetches the ``deno`` package and the binary
    package of this platform it depends on (no install scripts run)."""
    progress(f"installing {package} (JavaScript and TypeScript kernel) from the npm registry")
    work = staging / "npm"
    work.mkdir()
    _run(["npm", "install", "--prefix", str(work), "--ignore-scripts", "--no-save",
          "--no-audit", "--no-fund", "--no-package-lock", "--loglevel", "error", package],
         progress, "npm install deno", env={**os.environ, "npm_config_update_notifier": "false"})
    found = [p for p in (work / "node_modules" / "@deno").glob("*/deno") if p.is_file()]
    if not found:
        raise RuntimeUnavailableError(f"building template {NAME}: npm installed {package} "
                                      "without a binary for this platform")
    target = rootfs / DENO_TARGET.lstrip("/")
    target.parent.mkdir(parents=True, mode=0o755)
    os.chmod(target.parent.parent, 0o755)
    shutil.move(found[0], target)
    os.chmod(target, 0o755)
    shutil.rmtree(work, ignore_errors=True)
    check = subprocess.run([str(target), "--version"], capture_output=True, text=True,
                           timeout=120)
    if check.returncode != 0:
        raise RuntimeUnavailableError(f"building template {NAME}: deno does not run:\n"
                                      f"{(check.stdout + check.stderr)[-2000:]}")
    progress(check.stdout.splitlines()[0] if check.stdout else "deno ready")


def _install_r(rootfs: Path, staging: Path, progress: LineFn) -> bool:
    """R and IRkernel in the layer: the Debian packages apt would install for them on this
    host, downloaded and unpacked. Optional: without them (no apt lists, no mirror) the
    template is built without R, and says so (``abx template build --force`` tries
    again)."""
    progress(f"installing {' '.join(R_PACKAGES)} (the R kernel) from Debian's packages")
    env = {**os.environ, "LC_ALL": "C"}
    try:
        plan = subprocess.run(["apt-get", "install", "-s", "--no-install-recommends",
                               *R_PACKAGES], capture_output=True, text=True, timeout=300,
                              env=env, stdin=subprocess.DEVNULL)
        wanted = [f"{m.group(1)}={m.group(2)}" for m in
                  re.finditer(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", plan.stdout, re.M)]
        if plan.returncode != 0:
            raise RuntimeUnavailableError(plan.stderr.strip()[-1000:] or "apt-get failed")
        debs = staging / "debs"
        debs.mkdir()
        if wanted:
            got = subprocess.run(["apt-get", "download", "-q", *wanted], cwd=debs,
                                 capture_output=True, text=True, timeout=900, env=env,
                                 stdin=subprocess.DEVNULL)
            if got.returncode != 0:
                raise RuntimeUnavailableError(got.stderr.strip()[-1000:])
        tree = staging / "r"
        tree.mkdir()
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True,
                           capture_output=True, timeout=300)
        shutil.rmtree(debs, ignore_errors=True)
        # What the maintainer scripts would have made: libblas3's and liblapack3's
        # links, r-base-core's Renviron.
        for found in tree.glob("usr/lib/*/[bl][la][ap]*/lib*.so.3"):
            link = found.parent.parent / found.name
            if found.parent.name in ("blas", "lapack") and not link.exists():
                link.symlink_to(f"{found.parent.name}/{found.name}")
        _copy_host_libraries(tree)
        renviron = tree / "etc" / "R" / "Renviron"
        if (tree / "usr/lib/R/etc/Renviron.ucf").is_file() and not renviron.exists():
            shutil.copy2(tree / "usr/lib/R/etc/Renviron.ucf", renviron)
        for sub, suffix in _SUBTREES.items():
            if (tree / sub).is_dir():
                os.replace(tree / sub, rootfs.with_name(rootfs.name + suffix))
        shutil.rmtree(tree, ignore_errors=True)
    except (OSError, subprocess.SubprocessError, RuntimeUnavailableError) as exc:
        detail = exc.message if isinstance(exc, RuntimeUnavailableError) else str(exc)
        progress(f"R is left out (its packages could not be had: {detail[-500:]}); "
                 f"`abx template build {NAME} --force` tries again")
        return False
    progress(f"R ready ({len(wanted)} packages unpacked)")
    return True


# glibc's, and what every base has (the rootless base's packages): never copied.
_BASE_LIBRARIES = re.compile(r"^(ld-linux.*|lib(c|m|mvec|pthread|dl|rt|resolv|util|anl|"
                             r"nsl|crypt|z|stdc\+\+|gcc_s)\.so[.0-9]*)$")


def _copy_host_libraries(tree: Path) -> None:
    """The host's shared libraries that R's binaries need beyond glibc, copied into
    ``R_HOST_LIBS``: a base that has only a few packages' files (rootless sandboxes,
    Kubernetes images) lacks them; where the host's own are there (a root sandbox), R
    finds those first."""
    from agent_sandbox.backends.runc.templates import rootless_base

    elves = [str(p) for p in tree.rglob("*") if p.is_file() and not p.is_symlink()
             and (".so" in p.name or p.parent.name == "exec")]
    own = {p.name for p in tree.rglob("*.so*")}
    folder = tree / R_HOST_LIBS.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    for lib in sorted(rootless_base.library_closure(elves)):
        name = os.path.basename(lib)
        if name in own or _BASE_LIBRARIES.match(name) or not lib.startswith(("/usr/", "/lib")):
            continue
        if not (folder / name).exists():
            shutil.copyfile(os.path.realpath(lib), folder / name)
            os.chmod(folder / name, 0o644)
    # R runs `which` (utils' .onLoad): an alternatives link, no package's file, so a
    # base made of packages' files lacks it.
    which = tree / "usr/bin/which"
    if os.path.islink("/usr/bin/which") and not os.path.lexists(which):
        which.parent.mkdir(parents=True, exist_ok=True)
        which.symlink_to(os.readlink("/usr/bin/which"))


def _relocate(env_dir: Path, target: str) -> None:
    """Point the venv's absolute paths (shebangs, activate scripts) at ``target``."""
    old = str(env_dir)
    for path in (env_dir / "bin").iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() not in data[:4096] and not path.name.startswith("activate"):
            continue
        mode = path.stat().st_mode
        path.write_bytes(data.replace(old.encode(), target.encode()))
        os.chmod(path, mode)
    cfg = env_dir / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(old, target))


def store_for(config: EngineConfig) -> TemplateStore:
    """This host's template store as an engine with ``config`` sees it (for the CLI)."""
    from agent_sandbox.backends.runc.host.select import select_host_mode
    from agent_sandbox.backends.runc.templates.shared import SharedTemplates

    mode = select_host_mode(config)
    shared = SharedTemplates(config.shared_templates_dir, mirror_dirs=mode.name == "rootless")
    return TemplateStore(config.templates_dir, mode.assemble_base, shared)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=f"Build the {NAME} template (once; "
                                     "quick when it is already built; as root, for every "
                                     "user of the host).")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--index-url", default=None,
                        help="package index to build from (default: ABX_TEMPLATE_INDEX_URL, "
                             "else pip's own configuration, else PyPI)")
    args = parser.parse_args(argv)
    config = EngineConfig()
    store = store_for(config)
    index_url = config.template_index_url if args.index_url is None else args.index_url
    try:
        tmpl = ensure(store, index_url=index_url, force=args.force, progress=_stderr_line)
    except RuntimeUnavailableError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    print(f"{NAME}: ready ({describe_location(store, tmpl)})", file=sys.stderr)
    return 0


def describe_location(store: TemplateStore, tmpl: Template) -> str:
    shared = store.shared
    if shared is not None and any(lower.startswith(f"{shared.root}/") for layer in tmpl.layers
                                  for lower in layer.lowers):
        return f"shared by every user of this host, in {shared.root}"
    return f"this user's own, in {store.path(NAME)}"


if __name__ == "__main__":
    sys.exit(main())
