"""The wheel ``abx mcp deploy`` ships: abx-sandbox built from the checkout this ``abx`` runs
from, so an artifact installs exactly this code (never a same-named package from an index)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import agent_sandbox
from agent_sandbox import DISTRIBUTION, __version__
from agent_sandbox.surfaces.cli.output import CliError

PACKAGE_DIR = Path(agent_sandbox.__file__).resolve().parent
BUILD_TIMEOUT = 600
# What the build reads: pyproject.toml names README.md as the long description.
SOURCE_FILES = ("pyproject.toml", "README.md")
SETUPTOOLS_MIN = 77  # pyproject.toml's build-system requirement


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str
    source: Path
    commit: str | None  # short git commit, "+changes" when the tree differs from it

    def describe(self) -> str:
        at = f", git {self.commit}" if self.commit else ""
        return f"{DISTRIBUTION} {self.version} built from {self.source}{at}"


def wheel_name() -> str:
    return f"{DISTRIBUTION.replace('-', '_')}-{__version__}-py3-none-any.whl"


def source_root() -> Path:
    """The checkout ``agent_sandbox`` is imported from, or a CliError saying what to do."""
    root = PACKAGE_DIR.parent
    try:
        name = tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        name = None
    if name != DISTRIBUTION:
        raise CliError(f"this abx runs from {PACKAGE_DIR}, not from a source checkout of "
                       f"{DISTRIBUTION}, so it cannot build the wheel the artifact installs; "
                       "run abx from a checkout, or pass --package with a wheel file "
                       f"({wheel_name()}) or a pip requirement")
    return root


def _git_commit(root: Path) -> str | None:
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return None
    changes = git("status", "--porcelain", "--", *SOURCE_FILES, PACKAGE_DIR.name)
    return commit + ("+changes" if changes else "")


def _pip_args() -> list[str]:
    """Build offline with this interpreter's setuptools when it meets pyproject's
    requirement; else pip's isolated build (which fetches setuptools)."""
    try:
        from importlib.metadata import version

        if int(version("setuptools").split(".")[0]) >= SETUPTOOLS_MIN:
            return ["--no-build-isolation"]
    except (ImportError, ValueError, LookupError):
        pass
    return []


def build_wheel(dest_dir: Path) -> Wheel:
    """Build the wheel from a clean copy of the checkout (no build/ or egg-info left in it,
    nothing stale from an earlier build) and move it into ``dest_dir``."""
    root = source_root()
    with tempfile.TemporaryDirectory(prefix="abx-wheel-") as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        src.mkdir()
        for name in SOURCE_FILES:
            shutil.copy2(root / name, src / name)
        shutil.copytree(PACKAGE_DIR, src / PACKAGE_DIR.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *_pip_args(),
                "--wheel-dir", str(dist), str(src)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise CliError(f"building the {DISTRIBUTION} wheel took over {BUILD_TIMEOUT} s; "
                           "try again, or pass --package") from None
        built = dist / wheel_name()
        if proc.returncode != 0 or not built.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            hint = (" (this python has no pip: python -m ensurepip)" if "No module named pip"
                    in proc.stderr else "")
            raise CliError(f"could not build the {DISTRIBUTION} wheel from {root}{hint}:\n"
                           f"{tail}\nfix that, or pass --package with a wheel or a pip "
                           "requirement")
        dest_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        target = dest_dir / built.name
        shutil.move(str(built), str(target))
    return Wheel(target, __version__, root, _git_commit(root))


__all__ = ["Wheel", "build_wheel", "source_root", "wheel_name"]
