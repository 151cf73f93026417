"""E2B's JS SDKs (npm ``e2b`` and ``@e2b/code-interpreter``, versions pinned in
js/package.json) against a real gateway: ``js/e2b_flow.mjs`` is unmodified user code,
pointed at the gateway by environment variables only, printing one JSON line per step;
each test here checks one step's line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway
from npmcache import node_packages

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent / "js"
Steps = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def node_dir() -> Path:
    return node_packages(HERE)


def flow(node_dir: Path, gateway: E2BGateway, part: str, **extra: str) -> Steps:
    env = {**os.environ, **gateway.env("a"), "ABX_E2B_OTHER_KEY": gateway.keys["b"], **extra}
    done = subprocess.run(["node", str(node_dir / "e2b_flow.mjs"), part], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line["step"]: line for line in lines}


def ok(steps: Steps, name: str) -> dict[str, Any]:
    assert name in steps, f"step {name!r} never ran (an earlier one failed): {list(steps)}"
    seen = steps[name]
    assert seen["ok"], f"step {name!r} failed: {seen['error']}"
    return seen


@pytest.fixture(scope="module")
def sdk(node_dir: Path, e2b_gateway: E2BGateway) -> Steps:
    return flow(node_dir, e2b_gateway, "sdk")


@pytest.fixture(scope="module")
def interpreter(node_dir: Path, e2b_gateway: E2BGateway, code_template: str) -> Steps:
    return flow(node_dir, e2b_gateway, "interpreter")


def test_create_list_set_timeout(sdk: Steps) -> None:
    created = ok(sdk, "create")
    assert created["id"].startswith("sbx-") and created["template"] == "base"
    assert created["metadata"] == {"purpose": "js-sdk"}
    assert ok(sdk, "list")["listed"]
    assert ok(sdk, "set_timeout")["running"]


def test_update_network(sdk: Steps) -> None:
    """An allowlist is applied; E2B's options with no counterpart are refused by name."""
    refused = ok(sdk, "update_network")["refused"]["raised"]
    assert "maskRequestHost" in refused["message"] and "not supported" in refused["message"]


def test_run_with_callbacks(sdk: Steps) -> None:
    run = ok(sdk, "run")
    assert (run["exitCode"], run["stdout"], run["stderr"]) == (0, "out\n", "err\n")
    assert (run["onStdout"], run["onStderr"]) == ("out\n", "err\n")


def test_run_envs_cwd_user(sdk: Steps) -> None:
    assert ok(sdk, "run_envs_cwd")["stdout"] == "hi there\n/tmp\n"
    assert ok(sdk, "run_user")["stdout"] == "root\n"


def test_nonzero_exit_raises_command_exit_error(sdk: Steps) -> None:
    seen = ok(sdk, "run_exit_code")
    assert seen["raised"]["type"] == "CommandExitError" and seen["instanceOf"], seen
    assert seen["raised"]["exitCode"] == 3


def test_run_timeout(sdk: Steps) -> None:
    seen = ok(sdk, "run_timeout")
    assert seen.get("raised", {}).get("type") == "TimeoutError", seen


def test_background_kill_and_wait(sdk: Steps) -> None:
    killed = ok(sdk, "background_kill")
    assert killed["listed"] and killed["killed"] is True and killed["gone"], killed
    assert "raised" in killed["waited"], killed  # a killed command did not exit 0
    waited = ok(sdk, "background_wait")
    assert (waited["exitCode"], waited["stdout"]) == (0, "done\n")


def test_send_stdin(sdk: Steps) -> None:
    assert ok(sdk, "stdin")["stdout"] == "first\nsecond\n"


def test_pty(sdk: Steps) -> None:
    assert ok(sdk, "pty") == {**sdk["pty"], "answered": True, "killed": True}


def test_files(sdk: Steps) -> None:
    seen = ok(sdk, "files")
    assert seen["writtenPath"] == "/tmp/js/a.txt" and seen["text"] == "hello from js"
    assert seen["bytes"] == list(b"hello") and seen["bytesType"] == "Uint8Array"
    assert seen["names"] == ["a.txt:file", "sub:dir"]
    assert seen["movedPath"] == "/tmp/js/b.txt"
    assert (seen["existsOld"], seen["existsNew"], seen["existsAfterRemove"]) == \
        (False, True, False)
    assert ok(sdk, "read_missing")["raised"]["type"] == "FileNotFoundError"


def test_watch_dir(sdk: Steps) -> None:
    assert "create:new.txt" in ok(sdk, "watch_dir")["events"]


def test_upload_50_mb(sdk: Steps) -> None:
    seen = ok(sdk, "upload_50mb")
    assert seen == {**seen, "size": 50 * 1024 * 1024, "sameInside": True, "sameBack": True}


def test_other_key_cannot_see_or_touch(sdk: Steps) -> None:
    seen = ok(sdk, "other_key")
    assert not seen["sees"] and seen["stillRunning"], seen
    for call in ("connect", "info", "setTimeout"):
        assert seen[call]["raised"]["type"] == "SandboxNotFoundError", (call, seen[call])
    assert seen["kill"] == {"returned": False}  # the SDK's answer to a 404


def test_pause_connect(sdk: Steps) -> None:
    seen = ok(sdk, "pause_connect")
    assert (seen["paused"], seen["state"], seen["pausedAgain"]) == (True, "paused", False)
    assert seen["running"] and seen["stateAfter"] == "running"
    assert ok(sdk, "after_resume")["stdout"] == "/tmp/js/sub\n"


def test_kill(sdk: Steps) -> None:
    seen = ok(sdk, "kill")
    assert seen["killed"] is True and not seen["listed"] and seen["running"] is False
    assert seen["again"] == {"returned": False}


def test_run_code_state_and_output(interpreter: Steps) -> None:
    assert ok(interpreter, "create")["template"] == "code-interpreter-v1"
    assert ok(interpreter, "state") == {**interpreter["state"], "text": "42", "error": None}
    seen = ok(interpreter, "stdout")
    assert seen["stdout"] == ["hello\n"] and seen["callback"] == ["hello\n"]


def test_run_code_error(interpreter: Steps) -> None:
    seen = ok(interpreter, "error")
    assert seen["name"] == "ZeroDivisionError" and seen["hasTraceback"], seen


def test_run_code_matplotlib_png_chart_and_data(interpreter: Steps) -> None:
    seen = ok(interpreter, "png")
    assert seen["error"] is None and seen["pngMagic"] == "PNG", seen
    # The figure's chart and a DataFrame's data, as the JS SDK reads them (its formats()
    # names neither text nor chart: nothing is left in extra).
    assert seen["chartType"] == "line" and seen["formats"] == ["png"], seen
    assert [y for _, y in seen["chartPoints"]] == [1, 3, 2] and seen["data"] == {"a": [1, 2]}


def test_code_contexts(interpreter: Steps) -> None:
    seen = ok(interpreter, "contexts")
    assert seen == {**seen, "cwd": "/tmp", "isolated": "False", "listed": True,
                    "afterRestart": "False", "removed": True}


def test_run_code_typescript(interpreter: Steps) -> None:
    """A non-Python language through the JS SDK: Deno's kernel keeps state across cells,
    raises with E2B's error fields, and displays HTML."""
    seen = ok(interpreter, "typescript")
    assert seen == {**seen, "text": "42", "error": None, "errName": "TypeError",
                    "errValue": "bad 20", "html": "<b>20</b>"}, seen


def test_the_template_builder_builds_and_a_sandbox_runs_it(
        node_dir: Path, e2b_gateway: E2BGateway, tmp_path: Path) -> None:
    """``Template()`` and ``Template.build`` of the JS SDK: its copy uploaded by hash, its
    steps built with the logs streamed to ``onBuildLogs``, tags; the same build again is
    all cached; a failing step rejects with the step's message."""
    (tmp_path / "hello.txt").write_text("hello from js\n")
    steps = flow(node_dir, e2b_gateway, "template", ABX_E2B_CONTEXT=str(tmp_path))
    built = ok(steps, "build")
    assert built["templateId"] == "js-template" and set(built["tags"]) == {"v1", "stable"}
    logs = "\n".join(built["logs"])
    assert "Uploaded 'hello.txt'" in logs and "Build finished" in logs, logs
    assert ok(steps, "sandbox") == {
        "step": "sandbox", "ok": True, "whoami": "user", "greeting": "hi from js",
        "hello": "user 640\nhello from js", "built": "root\nmade\nuser", "started": "up"}
    again = ok(steps, "rebuild")
    logs = "\n".join(again["logs"])
    assert again["exists"] and "Skipping upload of 'hello.txt'" in logs, logs
    assert logs.count("(cached)") >= 7, logs
    failed = ok(steps, "failing")["raised"]
    assert failed["name"] == "BuildError" and "exit code 9" in failed["message"], failed
    assert httpx.delete(f"{e2b_gateway.url}/templates/js-template", headers={
        "X-API-KEY": e2b_gateway.keys["a"]}).status_code == 204


def test_unsupported_calls_say_so(node_dir: Path, e2b_gateway: E2BGateway) -> None:
    """What E2B offers and the gateway does not: a clear error naming the call and
    docs/e2b.md, not a misleading "sandbox not found" (the SDKs' reading of a 404)."""
    steps = flow(node_dir, e2b_gateway, "unsupported")
    ok(steps, "create")
    metrics = ok(steps, "getMetrics")
    assert metrics["count"] >= 1 and metrics["cpuCount"] >= 1
    assert 0 < metrics["memUsed"] <= metrics["memTotal"] and metrics["diskTotal"] > 0
    # Served now (snapshots and fork, the templates API): by the JS SDK unmodified too.
    assert ok(steps, "createSnapshot")["returned"]["snapshotId"].startswith("snap-"), steps
    for name in ("listSnapshots", "fork", "templateExists"):
        assert "raised" not in ok(steps, name), (name, steps[name])
    built = ok(steps, "templateBuild").get("raised") or {}
    assert not built.get("message", "").startswith("501: "), steps["templateBuild"]
    for name in ("volumeList", "secretCreate"):
        raised = ok(steps, name).get("raised")
        assert raised and raised["message"].startswith("501: "), (name, steps[name])
        assert "not supported" in raised["message"] and "docs/e2b.md" in raised["message"]
    mcp = ok(steps, "mcp").get("raised") or {}  # refused by name, not ignored
    assert "create option(s) mcp are not supported" in mcp.get("message", ""), steps["mcp"]
