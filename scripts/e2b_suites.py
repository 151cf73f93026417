"""E2B's own Python SDK test suites (vendored unmodified in tests/e2b/upstream/, README.md
there names their commits) run against a gateway of ours, as docs/e2b.md tells a user to
point E2B's SDKs at one: a fresh data dir, the embedded engine, ``abx serve`` on loopback
with an E2B-shaped key, and ``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_SANDBOX_URL`` set.

    .venv/bin/pip install -e '.[test,e2b-suites]'     # pytest-asyncio, which they use
    .venv/bin/python scripts/e2b_suites.py [--suite sdk|code-interpreter|templates]...
        [-n 2] [-k EXPR] [--json] [TEST ...]

Prints each test file's passed/failed/skipped, its failing tests, and a total per suite
(``--json``: the same as one JSON object on stdout; pytest's own output goes to stderr).
TEST: node ids relative to the suite's directory (with one ``--suite``). Needs root and
runc (the embedded engine); exit status 0 when every test ran passed or skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "tests" / "e2b" / "upstream"
# name: (directory, what runs by default). The SDK's own unit tests (no server), its
# volumes and secrets (mocked) never reach a gateway and are not run.
SUITES: dict[str, tuple[Path, list[str]]] = {
    "sdk": (UPSTREAM / "e2b", ["tests/sync/sandbox_sync", "tests/sync/api_sync",
                               "tests/async/sandbox_async", "tests/async/api_async",
                               "tests/shared/git"]),
    "code-interpreter": (UPSTREAM / "code-interpreter", ["tests"]),
    "templates": (UPSTREAM / "e2b", ["tests/sync/template_sync",
                                     "tests/async/template_async"]),
}
DEFAULT = ["sdk", "code-interpreter"]
KEY = {"e2b": True, "max_sandboxes": 50, "max_commands": 64}


def parse_junit(path: Path) -> dict[str, dict[str, object]]:
    """Test file -> its counts and failing tests, from pytest's xunit1 report."""
    files: dict[str, dict[str, object]] = {}
    if not path.exists():
        return files
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("file") or case.get("classname", "?")
        entry = files.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0,
                                        "failures": []})
        if case.find("failure") is not None or case.find("error") is not None:
            entry["failed"] += 1  # type: ignore[operator]
            entry["failures"].append(case.get("name"))  # type: ignore[union-attr]
        elif case.find("skipped") is not None:
            entry["skipped"] += 1  # type: ignore[operator]
        else:
            entry["passed"] += 1  # type: ignore[operator]
    return dict(sorted(files.items()))


def run_suite(name: str, env: dict[str, str], workers: int, keyword: str | None,
              tests: list[str], out: Path) -> dict[str, object]:
    directory, default = SUITES[name]
    xml = out / f"{name}.xml"
    args = [sys.executable, "-m", "pytest", "-c", str(directory / "pytest.ini"),
            "--rootdir", str(directory), "-p", "no:cacheprovider",
            # theirs, less the code interpreter's own --numprocesses: ours is -n
            "-o", "addopts=--import-mode=importlib", "-o", "junit_family=xunit1",
            "--junitxml", str(xml), "-q", "-rfE", "-n", str(workers)]
    if keyword:
        args += ["-k", keyword]
    proc = subprocess.run([*args, *(tests or default)], cwd=directory, env=env,
                          stdout=sys.stderr, stdin=subprocess.DEVNULL, check=False)
    files = parse_junit(xml)
    totals = {k: sum(f[k] for f in files.values()) for k in ("passed", "failed", "skipped")}
    return {"exit_code": proc.returncode, **totals, "files": files}


def report(results: dict[str, dict[str, object]]) -> str:
    lines = []
    for name, result in results.items():
        lines.append(f"== {name}")
        for file, f in result["files"].items():  # type: ignore[union-attr]
            lines.append(f"{f['passed']:4} passed {f['failed']:4} failed "
                         f"{f['skipped']:4} skipped  {file}")
            lines += [f"{'':36}FAILED {test}" for test in f["failures"]]
        lines.append(f"{name}: {result['passed']} passed, {result['failed']} failed, "
                     f"{result['skipped']} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES),
                        help=f"repeatable; default: {' and '.join(DEFAULT)}")
    parser.add_argument("-n", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k, within each suite")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("tests", nargs="*", help="node ids relative to the suite's directory")
    opts = parser.parse_args(argv)
    suites = opts.suite or DEFAULT
    if opts.tests and len(suites) != 1:
        parser.error("TEST names a suite's files: give exactly one --suite with it")
    if os.geteuid() != 0 or shutil.which("runc") is None:
        print("e2b_suites: the embedded engine needs root and runc "
              "(bash scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    try:
        __import__("pytest_asyncio")
    except ImportError:
        print("e2b_suites: E2B's tests need pytest-asyncio: "
              "pip install -e '.[test,e2b-suites]'", file=sys.stderr)
        return 2

    # Stopped (SIGTERM) as on Ctrl-C: pytest, the gateway and the data dir are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, str(ROOT / "bench"))
    from _gateway import engine_and_gateway

    out = Path(tempfile.mkdtemp(prefix="abx-e2b-suites-"))
    results: dict[str, dict[str, object]] = {}
    try:
        with engine_and_gateway({"suites": KEY}) as setup:
            if "code-interpreter" in suites:  # built once, not on a test's clock
                from agent_sandbox.backends.runc.templates import code_interpreter

                code_interpreter.ensure(setup.local.backend.templates)
            env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
            env.update({"E2B_API_KEY": setup.tokens["suites"], "E2B_API_URL": setup.gateway.url,
                        "E2B_SANDBOX_URL": setup.gateway.url})
            for name in suites:
                results[name] = run_suite(name, env, opts.n, opts.keyword, opts.tests, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(results, indent=2) if opts.json else report(results))
    return 0 if all(r["failed"] == 0 and r["exit_code"] in (0, 5)
                    for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
