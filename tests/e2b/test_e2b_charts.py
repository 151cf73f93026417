"""E2B's code interpreter's rich results through the real ``e2b_code_interpreter`` SDK:
``result.chart`` of matplotlib figures (line, scatter, bar, pie, box and whisker, a
superchart of several, an unknown one), ``result.data`` of a pandas DataFrame, images
shown or saved, and ``plt.savefig`` with ``plt.show()``.

E2B's own tests of these (of ``upstream/code-interpreter``, vendored unmodified) run first, each
test function given the ``sandbox`` (sync) or ``async_sandbox`` it asks for: one
code-interpreter sandbox for the module, the async SDK connected to it per test. Then what
E2B's tests leave out: a figure or frame too big for its data (the image still comes),
and chart JSON a hostile sandbox makes, which the gateway passes on unread or drops,
never failing the cell."""

from __future__ import annotations

import asyncio
import base64
import inspect
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

VENDORED = Path(__file__).parent / "upstream" / "code-interpreter" / "tests"
# E2B's tests of rich results (the rest run by scripts/e2b_suites.py, not in this suite).
OURS = ("charts", "images/test_images.py", "sync/test_data.py", "sync/test_display_data.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _vendored() -> list[Any]:
    cases = []
    for path in [p for part in OURS for p in sorted((VENDORED / part).glob("**/test_*.py"))
                 or [VENDORED / part]]:
        found = runpy.run_path(str(path))
        for name, fn in found.items():
            if name.startswith("test_") and callable(fn):
                cases.append(pytest.param(fn, id=f"{path.relative_to(VENDORED)}::{name}"))
    return cases


@pytest.mark.parametrize("case", _vendored())
def test_e2b_own_tests(case: Callable[..., Any], ci: object) -> None:
    from e2b_code_interpreter import AsyncSandbox

    params = list(inspect.signature(case).parameters)
    assert params in (["sandbox"], ["async_sandbox"]), params
    if params == ["sandbox"]:
        case(ci)
        return

    async def run() -> None:
        await case(await AsyncSandbox.connect(ci.sandbox_id))

    asyncio.run(run())


def _png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_SIGNATURE)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_savefig_and_show_as_in_e2b(ci: object) -> None:
    """As E2B's template: ``savefig`` to a file displays the picture it saved (matplotlib
    saves through Pillow, whose ``save`` to a file displays the image), and ``show``
    displays the figure, an image with its chart; a figure left open is displayed when the
    cell ends, one closed is not."""
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [2, 4, 8], label='twice')\nplt.title('saved')\n"
        "plt.savefig('/home/user/saved.png')\nplt.show()")
    assert execution.error is None
    saved, figure = execution.results
    on_disk = bytes(ci.files.read("/home/user/saved.png", format="bytes"))
    assert _png_size(base64.b64decode(saved.png)) == _png_size(on_disk)
    assert saved.text.startswith("<PIL.") and saved.chart is None
    assert base64.b64decode(figure.png).startswith(PNG_SIGNATURE)
    assert figure.chart.title == "saved" and figure.chart.elements[0].label == "twice"
    assert figure.formats() == ["text", "png", "chart"] and not figure.extra

    closed = ci.run_code("plt.plot([1, 2]); plt.savefig('/home/user/c.png'); plt.close()")
    assert closed.error is None and [r.chart for r in closed.results] == [None]
    left_open = ci.run_code("plt.bar(['a', 'b'], [3, 4]); plt.savefig('/home/user/o.png')")
    saved, figure = left_open.results
    assert saved.png and [bar.value for bar in figure.chart.elements] == [3, 4]


def test_too_big_for_data_or_chart_still_gives_the_rest(ci: object) -> None:
    big = ci.run_code("import numpy as np, matplotlib.pyplot as plt\n"
                      "plt.plot(np.arange(200_000), np.arange(200_000)); plt.show()")
    (figure,) = big.results
    assert figure.png and figure.chart is None and not big.error
    frame = ci.run_code("import pandas as pd\npd.DataFrame({'a': range(1_000_000)})")
    (result,) = frame.results
    assert result.data is None and "1000000 rows" in result.text + (result.html or "")
    small = ci.run_code("pd.DataFrame({'a': [1, 2]})")
    assert small.results[0].data == {"a": [1, 2]}


def test_chart_json_from_a_hostile_kernel(ci: object) -> None:
    """``e2b/chart`` is the sandbox's JSON: an object is passed on unread (the SDK makes
    of it what it can), anything else drops that display alone, and the cell goes on."""
    from e2b_code_interpreter.charts import Chart

    execution = ci.run_code(
        "from IPython.display import display\n"
        "display({'e2b/chart': {'type': 'unknown', 'title': 't', 'elements': []},"
        " 'text/plain': 'odd'}, raw=True)\n"
        "display({'e2b/chart': 'not an object', 'text/plain': 'bad'}, raw=True)\n"
        "display({'e2b/data': [1, 2], 'text/plain': 'bad too'}, raw=True)\n"
        "print('went on')")
    assert execution.error is None and execution.logs.stdout == ["went on\n"]
    (odd,) = execution.results
    assert odd.text == "odd" and isinstance(odd.chart, Chart) and odd.chart.title == "t"
    # A chart the SDK cannot read: it logs so and leaves result.chart None.
    garbled = ci.run_code("display({'e2b/chart': {'type': 'line', 'elements': 5},"
                          " 'text/plain': 'g'}, raw=True)")
    assert garbled.results[0].text == "g" and garbled.results[0].chart is None


def test_a_dict_or_list_is_its_own_json(ci: object) -> None:
    """As E2B's formatter: a dict or list value has ``json`` (numpy's values as lists and
    numbers, keys as strings, NaN as null), one holding other objects has none; a display's
    own JSON stays."""
    value = ci.run_code("import numpy as np\n{'a': [1, 2], 3: np.arange(2), 'f': np.float64(.5)}")
    (result,) = value.results
    assert result.json == {"a": [1, 2], "3": [0, 1], "f": 0.5} and result.is_main_result
    assert result.formats() == ["text", "json"]
    assert ci.run_code("[1, 'x', None]").results[0].json == [1, "x", None]
    for not_json in ("[object()]", "(1, 2)", "'text'"):
        assert ci.run_code(not_json).results[0].json is None, not_json
    # NaN and the infinities are null (as E2B's orjson gives them), in a chart too.
    assert ci.run_code("[float('nan'), float('inf')]").results[0].json == [None, None]
    gap = ci.run_code("import matplotlib.pyplot as plt\nplt.plot([1, float('nan'), 3]); plt.show()")
    assert gap.results[0].chart.elements[0].points[1] == (1.0, None)
    assert gap.logs.stderr == []  # no warning of the kernel's about a message not JSON
    shown = ci.run_code("from IPython.display import JSON\nJSON({'k': 1})")
    assert shown.results[0].json == {"k": 1}
