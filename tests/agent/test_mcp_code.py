"""run_code over MCP (STDIO): state, errors, and matplotlib figures as image content."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest
from _helpers import stdio_params
from mcp import Client

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_run_code_text_state_errors_and_png_image() -> None:
    async def main() -> None:
        async with Client(stdio_params(), mode="legacy") as c:
            r = await c.call_tool("run_code", {"code": "x = 41\nprint('hi')"})
            assert not r.is_error
            data: dict[str, Any] = r.structured_content or {}
            assert data["stdout"] == "hi\n" and "error" not in data  # no exception: left out
            r = await c.call_tool("run_code", {"code": "x + 1"})
            data = r.structured_content or {}
            assert data["results"][0] == {"is_main_result": True, "formats": ["text"],
                                          "text": "42"}
            assert "42" in r.content[0].text  # type: ignore[union-attr]

            r = await c.call_tool("run_code", {"code": "1/0"})
            assert not r.is_error  # the code failed, not the tool
            data = r.structured_content or {}
            assert data["error"]["name"] == "ZeroDivisionError"
            assert "ZeroDivisionError" in r.content[0].text  # type: ignore[union-attr]

            r = await c.call_tool("run_code", {"code": "import matplotlib.pyplot as plt\n"
                                               "plt.plot([1, 2, 3])\nplt.show()"})
            assert not r.is_error
            images = [p for p in r.content if p.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png"  # type: ignore
            png = base64.b64decode(images[0].data)  # type: ignore[union-attr]
            assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
            data = r.structured_content or {}
            assert data["results"][0]["png"] == "(attached as image #1)"
            assert "image #1 attached" in r.content[0].text  # type: ignore[union-attr]
            # The figure's chart data (E2B's result.chart), named in the text too.
            chart = data["results"][0]["chart"]
            assert data["results"][0]["formats"] == ["text", "png", "chart"]
            assert chart["type"] == "line" and len(chart["elements"][0]["points"]) == 3
            assert "chart: line, 1 element" in r.content[0].text  # type: ignore[union-attr]

            r = await c.call_tool("run_code", {"code": "import time; time.sleep(30)",
                                               "timeout": 1})
            data = r.structured_content or {}
            assert data["error"]["name"] == "TimeoutError"
            r = await c.call_tool("run_code", {"code": "x"})
            assert (r.structured_content or {})["results"][0]["text"] == "41"

    anyio.run(main)


def test_run_code_on_a_template_without_kernel() -> None:
    async def main() -> None:
        async with Client(stdio_params(ABX_MCP_TEMPLATE="base"), mode="legacy") as c:
            # The first call of a session: the lazy default comes from a kernel template.
            r = await c.call_tool("run_code", {"code": "6*7"})
            assert not r.is_error and r.structured_content["results"][0]["text"] == "42"
            r = await c.call_tool("create_sandbox", {})
            plain = r.structured_content["sandbox"]["sandbox_id"]
            r = await c.call_tool("run_code", {"code": "1", "sandbox_id": plain})
            assert r.is_error
            text = r.content[0].text  # type: ignore[union-attr]
            assert "code-interpreter-v1" in text and "run_command" in text

    anyio.run(main)


def test_run_code_in_other_languages() -> None:
    """Each language in its own default context; a language the template lacks, or one
    no kernel here runs, is an error of the tool naming the languages."""
    async def main() -> None:
        async with Client(stdio_params(), mode="legacy") as c:
            r = await c.call_tool("run_code", {"code": "N=6; echo $((N*7))",
                                               "language": "bash"})
            assert not r.is_error and (r.structured_content or {})["stdout"] == "42\n"
            r = await c.call_tool("run_code", {"code": "const a: number = 41; a + 1",
                                               "language": "typescript"})
            text = r.content[0].text  # type: ignore[union-attr]
            if "no typescript kernel" not in text:  # a host without npm: no Deno
                assert not r.is_error, text
                assert (r.structured_content or {})["results"][0]["text"] == "42"
            r = await c.call_tool("run_code", {"code": "1", "language": "java"})
            assert r.is_error
            assert "python, javascript, typescript, bash" in r.content[0].text  # type: ignore

    anyio.run(main)
