"""E2B's code interpreter (port 49999) through the real ``e2b_code_interpreter`` SDK:
cells with state, output streams and callbacks, errors, figures and display data, env
vars, contexts (create, list, restart, remove), a client timeout that interrupts the cell,
and clear errors (unsupported language, a sandbox without a kernel, malformed requests).
One sandbox for the module: each test uses names of its own."""

from __future__ import annotations

import asyncio
import base64
import threading

import httpx
import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def test_state_is_kept_between_cells(ci: object) -> None:
    first = ci.run_code("state_x = 1")
    assert first.error is None and first.results == []
    second = ci.run_code("state_x + 1")
    assert second.text == "2"
    assert second.results[0].is_main_result
    assert isinstance(second.execution_count, int)
    assert second.execution_count > (first.execution_count or 0)
    assert ci.run_code("'a string'").text == "a string"  # E2B gives a str without quotes


def test_logs_and_output_callbacks(ci: object) -> None:
    out, err = [], []
    execution = ci.run_code(
        "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)",
        on_stdout=out.append, on_stderr=err.append)
    assert "".join(execution.logs.stdout) == "to stdout\n"
    assert "".join(execution.logs.stderr) == "to stderr\n"
    assert "".join(m.line for m in out) == "to stdout\n"
    assert "".join(m.line for m in err) == "to stderr\n"
    assert not out[0].error and err[0].error
    assert isinstance(out[0].timestamp, int) and out[0].timestamp > 0


def test_error_with_traceback(ci: object) -> None:
    errors = []
    execution = ci.run_code("print('before')\n1 / 0", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "ZeroDivisionError" in execution.error.traceback
    assert errors and errors[0].name == "ZeroDivisionError"
    assert "".join(execution.logs.stdout) == "before\n"


def test_matplotlib_figure_is_a_png(ci: object) -> None:
    results = []
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
        on_result=results.append)
    assert execution.error is None
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    assert [r.png for r in results] == [pngs[0]]  # the callback got it as it came


def test_display_html_and_json(ci: object) -> None:
    execution = ci.run_code(
        "from IPython.display import display, HTML, JSON\n"
        "display(HTML('<b>bold</b>'))\ndisplay(JSON({'a': [1, 2]}))\n'last'")
    assert execution.error is None
    html, data, main = execution.results
    assert html.html == "<b>bold</b>" and not html.is_main_result
    assert data.json == {"a": [1, 2]}
    assert main.is_main_result and main.text == "last"
    assert "html" in html.formats()


def test_env_vars_for_one_cell(ci: object) -> None:
    value = "it's \"quoted\"\nand ünïcode"
    execution = ci.run_code(
        "import os, subprocess\nprint(repr(os.environ['ABX_CELL_VAR']))\n"
        "print(subprocess.run(['sh', '-c', 'echo \"$ABX_CELL_VAR\"'], capture_output=True, "
        "text=True).stdout, end='')",
        envs={"ABX_CELL_VAR": value})
    assert execution.error is None, execution.error
    assert "".join(execution.logs.stdout) == f"{value!r}\n{value}\n"
    after = ci.run_code("import os\nprint(os.environ.get('ABX_CELL_VAR'))")
    assert "".join(after.logs.stdout) == "None\n"  # set for that cell only
    names = ci.run_code("sorted(n for n in dir() if 'abx' in n.lower())")
    assert names.text == "[]"  # nothing of ours left in the user's namespace


def test_cells_start_in_the_default_users_home_as_in_e2b(ci: object) -> None:
    """envd puts a relative path in /home/user; a cell finds it there by the same name."""
    ci.files.write("relative_e2b.txt", "found")
    assert ci.run_code("open('relative_e2b.txt').read()").text == "found"
    assert ci.run_code("import os\nos.chdir('/tmp')").error is None
    assert ci.run_code("os.getcwd()").text == "/tmp"  # the user's own chdir holds
    ci.restart_code_context("default")
    assert ci.run_code("import os\nos.getcwd()").text == "/home/user"  # a new kernel: home
    ctx = ci.create_code_context()
    assert ctx.cwd == "/home/user"
    assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "/home/user"
    ci.remove_code_context(ctx)


def test_contexts(ci: object) -> None:
    from e2b import NotFoundException

    ctx = ci.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    assert ci.run_code("ctx_y = 5", context=ctx).error is None
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    assert ci.run_code("ctx_y", context=ctx).text == "5"
    assert ci.run_code("ctx_y").error.name == "NameError"  # the default context is another
    listed = {c.id: c for c in ci.list_code_contexts()}
    assert listed[ctx.id].cwd == "/tmp" and listed[ctx.id].language == "python"
    # E2B's server starts Python's and JavaScript's default contexts at boot: listed
    # whether or not a cell has run in them yet, and usable by what the list says.
    defaults = {c.language: c for c in listed.values() if c.id != ctx.id}
    assert {"python", "javascript"} <= set(defaults)
    assert ci.run_code("6 * 7", context=defaults["python"]).text == "42"

    ci.restart_code_context(ctx)
    gone = ci.run_code("ctx_y", context=ctx)
    assert gone.error is not None and gone.error.name == "NameError"

    ci.remove_code_context(ctx.id)
    assert ctx.id not in {c.id for c in ci.list_code_contexts()}
    with pytest.raises(NotFoundException, match="not found"):
        ci.run_code("1", context=ctx)
    with pytest.raises(NotFoundException, match="not found"):
        ci.restart_code_context(ctx)
    with pytest.raises(NotFoundException, match="not found"):
        ci.remove_code_context("ctx-00000000")


def test_timeout_interrupts_the_cell(ci: object) -> None:
    from e2b import TimeoutException

    assert ci.run_code("kept = 'yes'").error is None
    with pytest.raises(TimeoutException, match="timed out"):
        ci.run_code("import time\nfor _ in range(600): time.sleep(1)\nfinished = True",
                    timeout=3)
    # The client's leaving interrupted the cell: the context answers (not after the
    # 600 s loop), the loop did not finish, the variables are kept.
    after = ci.run_code("('finished' in globals(), kept)", timeout=120)
    assert after.text == "(False, 'yes')"


def test_async_sdk(ci: object, e2b_env: E2BGateway) -> None:
    from e2b_code_interpreter import AsyncSandbox

    async def main() -> tuple[object, list[str]]:
        sb = await AsyncSandbox.connect(ci.sandbox_id)
        lines: list[str] = []

        async def on_stdout(msg: object) -> None:
            lines.append(msg.line)

        return await sb.run_code("print('async'); 6 * 7", on_stdout=on_stdout), lines

    execution, lines = asyncio.run(main())
    assert execution.text == "42" and lines == ["async\n"]


def test_unsupported_language(ci: object) -> None:
    from e2b import SandboxException

    with pytest.raises(SandboxException, match="400.*'java' is not supported.*python, "
                       "javascript, typescript, bash"):
        ci.run_code("1", language="java")
    assert ci.run_code("1 + 1", language="Python").text == "2"


def test_base_sandbox_has_no_interpreter(e2b_sandbox: object) -> None:
    from e2b import SandboxException
    from e2b_code_interpreter import Sandbox

    sb = Sandbox.connect(e2b_sandbox.sandbox_id)
    with pytest.raises(SandboxException, match="no code interpreter.*code-interpreter-v1"):
        sb.run_code("1")
    with pytest.raises(SandboxException, match="no code interpreter"):
        sb.create_code_context()


def test_malformed_requests_get_clear_errors(ci: object, e2b_gateway: E2BGateway) -> None:
    headers = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999",
               "X-Access-Token": ci._envd_access_token}
    with httpx.Client(base_url=e2b_gateway.url, headers=headers, timeout=60) as http:
        assert http.get("/health").json() == "OK"
        cases = [({"language": "python"}, "code is required"),
                 ({"code": 1}, "code must be a string"),
                 ({"code": "1", "context_id": "default", "language": "python"},
                  "Only one of context_id or language"),
                 ({"code": "1", "env_vars": {"1BAD": "x"}}, "not a variable name"),
                 ({"code": "1", "env_vars": {"A": 1}}, "must be a string")]
        for body, message in cases:
            res = http.post("/execute", json=body)
            assert res.status_code == 400 and message in res.text, (body, res.text)
        res = http.post("/execute", content=b"not json")
        assert res.status_code == 400 and "JSON object" in res.text
        res = http.post("/execute", json={"code": "1", "context_id": "../../etc"})
        assert res.status_code == 404 and "not found" in res.text
        res = http.get("/nothing-here")
        assert res.status_code == 404 and "docs/e2b.md" in res.text
        # Without the sandbox's token nothing runs.
        res = http.post("/execute", json={"code": "1"},
                        headers={"X-Access-Token": "wrong"})
        assert res.status_code == 401


def test_a_running_cell_streams_and_holds_a_command_slot(e2b_gateway: E2BGateway,
                                                         code_template: str) -> None:
    """Output arrives while the cell runs; the cell holds one of its key's command slots
    (a key with one is refused a second cell, 429) and gives it back when it ends."""
    from e2b import SandboxException
    from e2b_code_interpreter import Sandbox

    _, key = e2b_gateway.store.create("ci-one-slot", e2b=True, max_sandboxes=1,
                                      max_commands=1)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**e2b_gateway.env("a"), "E2B_API_KEY": key}.items():
            mp.setenv(name, value)
        sb = Sandbox.create()
    try:
        running = threading.Event()
        done: list[object] = []
        cell = threading.Thread(target=lambda: done.append(sb.run_code(
            "import os, time\nprint('waiting', flush=True)\n"
            "while not os.path.exists('/tmp/release'): time.sleep(0.1)\n'released'",
            on_stdout=lambda _: running.set(), timeout=120)))
        cell.start()
        assert running.wait(60), "no output while the cell ran"
        with pytest.raises(SandboxException, match="429.*commands at once"):
            sb.run_code("1")
        sb.files.write("/tmp/release", "")
        cell.join(60)
        assert done and done[0].text == "released"
        assert sb.run_code("1 + 1").text == "2"  # the slot came back with the cell's end
    finally:
        sb.kill()
