"""run_code through the SDK, the same tests on the embedded engine and through the gateway
(tests/sdk/conftest.py runs each twice): results, streamed output, errors, figures,
timeouts, contexts; and the same exception classes either way."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError
from agent_sandbox.core.models import Result

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def sb(code_template: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template=code_template)
    yield sandbox
    sandbox.kill(delete_volume=True)


def test_results_output_errors_and_png(sb: Sandbox) -> None:
    r = sb.run_code("1+1")
    assert r.error is None and r.text == "2" and r.context_id == "default"
    assert [res.is_main_result for res in r.results] == [True]

    out: list[str] = []
    err: list[str] = []
    r = sb.run_code("import sys\nprint('hello')\nprint('warn', file=sys.stderr)",
                    on_stdout=out.append, on_stderr=err.append)
    assert r.stdout == "hello\n" and r.stderr == "warn\n" and r.results == []
    assert "".join(out) == "hello\n" and "".join(err) == "warn\n"

    r = sb.run_code("def f():\n    return 1/0\nf()", on_stdout=out.append)
    assert r.error is not None and r.error.name == "ZeroDivisionError"
    assert r.error.value == "division by zero"
    assert "return 1/0" in r.error.traceback and "\x1b[" not in r.error.traceback

    seen: list[Result] = []
    r = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"
                    "{'k': [1, 2]}", on_result=seen.append)
    assert r.error is None, r.error
    figures = [res for res in r.results if res.png]
    assert len(figures) == 1 and not figures[0].is_main_result
    png = base64.b64decode(figures[0].png or "")
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    assert r.results[-1].is_main_result and r.results[-1].text == "{'k': [1, 2]}"
    assert seen == r.results  # the callback saw each result, in order, as it came
    # The figure's chart (E2B's result.chart) and a DataFrame's columns, each a format.
    chart = figures[0].chart or {}
    assert figures[0].formats() == ["text", "png", "chart"] and not figures[0].extra
    assert chart["type"] == "line" and [p[1] for p in chart["elements"][0]["points"]] == [1, 3, 2]
    r = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
    assert r.results[0].data == {"a": [1, 2], "b": ["x", None]}
    assert r.results[0].formats() == ["text", "html", "data"]


def test_timeout_interrupts_and_keeps_state(sb: Sandbox) -> None:
    sb.run_code("x = 41")
    r = sb.run_code("import time\nfor _ in range(300): time.sleep(0.1)", timeout=1,
                    on_stdout=lambda _: None)  # remotely: the streamed path
    assert r.error is not None and r.error.name == "TimeoutError"
    assert "KeyboardInterrupt" in r.error.traceback
    r = sb.run_code("x + 1", timeout=1)  # the non-streamed path
    assert r.text == "42" and not r.kernel_restarted


def test_contexts_are_separate(sb: Sandbox) -> None:
    sb.run_code("tag = 'default'")
    ctx = sb.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp" and ctx.language == "python"
    assert {c.id for c in sb.list_code_contexts()} == {"default", ctx.id}
    r = sb.run_code("import os\ntag = 'other'\nos.getcwd()", context=ctx)
    assert r.text == "'/tmp'" and r.context_id == ctx.id
    assert sb.run_code("tag").text == "'default'"
    assert sb.run_code("tag", context=ctx.id).text == "'other'"

    sb.restart_code_context(ctx)
    r = sb.run_code("tag", context=ctx)
    assert r.error is not None and r.error.name == "NameError"
    assert sb.run_code("tag").text == "'default'"  # the default context was left alone
    sb.restart_code_context()
    assert sb.run_code("tag").error is not None

    sb.remove_code_context(ctx)
    assert {c.id for c in sb.list_code_contexts()} == {"default"}
    with pytest.raises(NotFoundError, match="not found"):
        sb.run_code("1", context=ctx)


def test_errors_are_the_same_classes(sb: Sandbox, code_template: str) -> None:
    with pytest.raises(NotFoundError, match="code context 'ctx-00000000' not found"):
        sb.run_code("1", context="ctx-00000000")
    with pytest.raises(NotFoundError):
        sb.run_code("1", context="ctx-00000000", on_stdout=print)  # streamed
    with pytest.raises(NotFoundError):
        sb.restart_code_context("ctx-00000000")
    with pytest.raises(NotFoundError):
        sb.remove_code_context("ctx-00000000")
    for bad in ("../x", "a/b", "", "UPPER"):
        with pytest.raises(InvalidArgumentError, match="invalid code context id"):
            sb.run_code("1", context=bad)
    with pytest.raises(InvalidArgumentError, match="language 'ruby' is not supported"):
        sb.run_code("1", language="ruby")
    with pytest.raises(InvalidArgumentError, match="timeout"):
        sb.run_code("1", timeout=-1)
    with pytest.raises(InvalidArgumentError, match="code must be a string"):
        sb.run_code(b"1")  # type: ignore[arg-type]
    with Sandbox.create() as plain, pytest.raises(WrongStateError, match=code_template):
        plain.run_code("1")


def test_async_sandbox_with_coroutine_callbacks(code_template: str) -> None:
    async def main() -> None:
        out: list[str] = []
        results: list[Result] = []

        async def on_stdout(text: str) -> None:
            out.append(text)

        async with await AsyncSandbox.create(template=code_template) as sb:
            r = await sb.run_code("print('a')\n6 * 7", on_stdout=on_stdout,
                                  on_result=results.append)
            assert r.text == "42" and out == ["a\n"] and [x.text for x in results] == ["42"]
            ctx = await sb.create_code_context()
            assert ctx.id in {c.id for c in await sb.list_code_contexts()}

    asyncio.run(main())
