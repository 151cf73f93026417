"""The code interpreter against real ipykernels in real code-interpreter-v1 sandboxes."""

from __future__ import annotations

import base64
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import NotFoundError

pytestmark = pytest.mark.integration

TEMPLATE = "code-interpreter-v1"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def _template(code_template: str) -> None:
    """Build the template once per test session (it lives in the session's data dir)."""


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template=TEMPLATE)
    yield sandbox
    sandbox.kill(delete_volume=True)


@pytest.fixture
def fresh() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template=TEMPLATE)
    yield sandbox
    try:
        sandbox.kill(delete_volume=True)
    except NotFoundError:
        pass


def test_state_main_result_stdout_and_errors(sb: Sandbox) -> None:
    assert sb.run_code("x = 41").error is None
    r = sb.run_code("x + 1")
    assert r.error is None and r.text == "42"
    main = [res for res in r.results if res.is_main_result]
    assert len(main) == 1 and main[0].text == "42" and main[0].formats() == ["text"]

    r = sb.run_code("print('hello', x)\nimport sys; print('warn', file=sys.stderr)")
    assert r.stdout == "hello 41\n" and r.stderr == "warn\n" and r.results == []

    r = sb.run_code("1/0")
    assert r.error is not None and r.error.name == "ZeroDivisionError"
    assert r.error.value == "division by zero" and "1/0" in r.error.traceback
    assert "\x1b[" not in r.error.traceback  # colour codes stripped
    r = sb.run_code("x * 2")
    assert r.error is None and r.text == "82"
    assert r.execution_count is not None and r.execution_count >= 4


def test_rich_results(sb: Sandbox) -> None:
    r = sb.run_code("from IPython.display import display, HTML, JSON, SVG\n"
                    "display(HTML('<b>hi</b>'))\n"
                    "display(JSON({'a': 1}))\n"
                    "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))\n"
                    "{'k': [1, 2]}")
    assert r.error is None, r.error
    html, js, svg, main = r.results
    assert html.html == "<b>hi</b>" and not html.is_main_result
    assert js.json == {"a": 1}
    assert svg.svg is not None and "<svg" in svg.svg
    assert main.is_main_result and main.text == "{'k': [1, 2]}"


def test_matplotlib_png(sb: Sandbox) -> None:
    r = sb.run_code("import matplotlib.pyplot as plt\n"
                    "plt.plot([1, 3, 2]); plt.title('t')\nplt.show()")
    assert r.error is None, r.error
    pngs = [res.png for res in r.results if res.png]
    assert len(pngs) == 1
    data = base64.b64decode(pngs[0])
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_timeout_interrupts_and_keeps_state(sb: Sandbox) -> None:
    sb.run_code("kept = 'yes'")
    started = time.monotonic()
    r = sb.run_code("import time; time.sleep(100)", timeout=1)
    took = time.monotonic() - started
    assert r.error is not None and r.error.name == "TimeoutError", r.error
    assert "timed out" in r.error.value and took < 5
    assert sb.run_code("kept").text == "'yes'"


def test_streaming_callbacks_fire_while_running(sb: Sandbox) -> None:
    seen: list[tuple[float, str, str]] = []
    started = time.monotonic()

    def note(kind: str) -> object:
        return lambda item: seen.append((time.monotonic() - started, kind, str(item)))

    r = sb.run_code("import sys, time\nprint('first', flush=True)\n"
                    "print('oops', file=sys.stderr, flush=True)\n"
                    "display('shown')\ntime.sleep(1.5)\nprint('second')",
                    on_stdout=note("out"), on_stderr=note("err"),
                    on_result=note("result"))  # type: ignore[arg-type]
    took = time.monotonic() - started
    assert r.error is None and r.stdout == "first\nsecond\n"
    kinds = {kind: at for at, kind, _ in reversed(seen)}
    assert set(kinds) == {"out", "err", "result"}
    for kind in ("out", "err", "result"):
        assert kinds[kind] < took - 1.0, (kind, seen, took)  # before the sleep ended


def test_contexts_are_independent(sb: Sandbox) -> None:
    ctx = sb.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp" and ctx.id != "default"
    sb.run_code("only_here = 1", context=ctx)
    assert sb.run_code("only_here", context=ctx).text == "1"
    r = sb.run_code("only_here")
    assert r.error is not None and r.error.name == "NameError"
    assert sb.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    assert sb.run_code("import os; os.getcwd()").text == "'/workspace'"
    with pytest.raises(NotFoundError):
        sb.run_code("1", context="ctx-nothere")


def test_restart_context_loses_variables(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    sb.run_code("gone = 1", context=ctx)
    sb.restart_code_context(ctx)
    r = sb.run_code("gone", context=ctx)
    assert r.error is not None and r.error.name == "NameError"


def test_crashed_kernel_is_restarted(sb: Sandbox) -> None:
    ctx = sb.create_code_context()
    sb.run_code("before = 1", context=ctx)
    started = time.monotonic()
    r = sb.run_code("import os; os._exit(3)", context=ctx, timeout=30)
    assert r.error is not None and r.error.name == "KernelDiedError", r.error
    assert time.monotonic() - started < 10
    r = sb.run_code("1 + 1", context=ctx)
    assert r.error is None and r.text == "2" and r.kernel_restarted
    # Killed from outside between calls: found dead, restarted, the cell still runs.
    sb.commands.run("pkill -9 -f ipykernel_launcher || true")
    r = sb.run_code("2 + 2", context=ctx)
    assert r.text == "4" and r.kernel_restarted


def test_pause_and_resume_keep_the_kernel(fresh: Sandbox) -> None:
    fresh.run_code("z = 7")
    fresh.pause()
    assert fresh.run_code("z").text == "7"  # resumed on use


def test_engine_restart_reconnects(fresh: Sandbox) -> None:
    from agent_sandbox.providers.local import embedded_service

    fresh.run_code("w = 'still here'")
    other = embedded_service(reaper=False)  # another engine process would do the same
    try:
        r = other.run_code(fresh.sandbox_id, "w")
        assert r.text == "'still here'" and not r.kernel_restarted
    finally:
        other.close()


def _tiny_wheel() -> Path:
    out = Path(tempfile.mkdtemp(prefix="abx-wheel-"))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                           "--only-binary=:all:", "-d", str(out), "termcolor"],
                          capture_output=True, text=True)
    wheels = list(out.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"no wheel to install offline: {proc.stderr[-300:]}")
    return wheels[0]


def test_reset_rootfs_drops_pip_installs_keeps_workspace(fresh: Sandbox) -> None:
    wheel = _tiny_wheel()
    target = f"/workspace/{wheel.name}"
    fresh.files.write(target, wheel.read_bytes())
    r = fresh.commands.run(f"pip install --no-index {target}", timeout=120)
    assert r.exit_code == 0, r.stderr
    assert fresh.run_code("import termcolor; termcolor.__name__").text == "'termcolor'"
    fresh.reset_rootfs()
    assert fresh.files.exists(target)
    r = fresh.run_code("import termcolor")
    assert r.error is not None and r.error.name == "ModuleNotFoundError"
    assert r.kernel_restarted
    assert fresh.run_code("import numpy; int(numpy.arange(4).sum())").text == "6"


def test_languages_have_default_contexts_of_their_own(sb: Sandbox) -> None:
    """Our SDK: ``language`` picks the language's default context; a context made for a
    language runs it; naming a context of another language is refused."""
    from agent_sandbox.core.errors import InvalidArgumentError

    assert sb.run_code("A=41", language="bash").error is None
    r = sb.run_code("echo $((A+1))", language="sh")
    assert (r.stdout, r.context_id) == ("42\n", "default-bash")
    assert sb.run_code("'A' in dir()").text == "False"  # Python's own context
    ctx = sb.create_code_context(language="bash", cwd="/tmp")
    assert ctx.language == "bash"
    assert sb.run_code("pwd", context=ctx).stdout == "/tmp\n"
    with pytest.raises(InvalidArgumentError, match="runs bash, not python"):
        sb.run_code("1", context=ctx, language="python")
    assert {c.id: c.language for c in sb.list_code_contexts()}[ctx.id] == "bash"
    sb.remove_code_context(ctx)


def test_bad_language() -> None:
    from agent_sandbox.core.errors import InvalidArgumentError

    with Sandbox.create(template=TEMPLATE) as s, pytest.raises(
            InvalidArgumentError, match="'java' is not supported.*python, javascript"):
        s.run_code("1", language="java")


def test_parallel_contexts_run_concurrently(sb: Sandbox) -> None:
    a, b = sb.create_code_context(), sb.create_code_context()
    out: dict[str, float] = {}

    def run(name: str, ctx: object) -> None:
        sb.run_code("import time; time.sleep(1)", context=ctx)  # type: ignore[arg-type]
        out[name] = time.monotonic()

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(n, c)) for n, c in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(out.values()) - started < 1.9
