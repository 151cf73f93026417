"""scripts/e2b_suites.py (run by hand: E2B's vendored suites against a gateway): what it
runs is there, with its source's license, and its per-file report counts what pytest's
report says."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("e2b_suites", ROOT / "scripts" / "e2b_suites.py")
assert _spec is not None and _spec.loader is not None
suites = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suites)

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="a" name="test_ok" file="tests/sync/test_a.py" line="1"/>
<testcase classname="a" name="test_bad" file="tests/sync/test_a.py" line="5">
<failure message="boom">boom</failure></testcase>
<testcase classname="b" name="test_later" file="tests/test_b.py" line="1">
<skipped message="no"/></testcase>
<testcase classname="b" name="test_fixture" file="tests/test_b.py" line="9">
<error message="setup">setup</error></testcase>
</testsuite></testsuites>"""


def test_every_suite_runs_vendored_files_with_their_license() -> None:
    for directory, paths in suites.SUITES.values():
        assert (directory / "pytest.ini").is_file() and (directory / "LICENSE").is_file()
        assert all((directory / p).exists() for p in paths), directory
    assert "b8029973a" in (suites.UPSTREAM / "README.md").read_text()


def test_report_counts_each_file(tmp_path: Path) -> None:
    (tmp_path / "r.xml").write_text(REPORT)
    files = suites.parse_junit(tmp_path / "r.xml")
    assert files == {
        "tests/sync/test_a.py": {"passed": 1, "failed": 1, "skipped": 0,
                                 "failures": ["test_bad"]},
        "tests/test_b.py": {"passed": 0, "failed": 1, "skipped": 1,
                            "failures": ["test_fixture"]}}
    result = {"exit_code": 1, "passed": 1, "failed": 2, "skipped": 1, "files": files}
    text = suites.report({"sdk": result})
    assert text.splitlines()[-1] == "sdk: 1 passed, 2 failed, 1 skipped"
    assert "FAILED test_bad" in text
    json.dumps(result)  # what --json prints
    assert suites.parse_junit(tmp_path / "missing.xml") == {}  # pytest never started
