"""What run_code's MCP result takes of the JSON formats a sandbox made (a display's
``json``, a DataFrame's ``data``, a figure's ``chart``): each as it is within its share of
the output budget, left out with a note past it; a chart named in the text from its
strings only."""

from __future__ import annotations

import json

from agent_sandbox.core.models import Result
from agent_sandbox.surfaces.mcp.tools import _chart_line, json_formats


def test_json_formats_within_the_budget_or_left_out_with_a_note() -> None:
    chart = {"type": "line", "title": "t", "elements": [{"points": [[1, 2]] * 50}]}
    res = Result.from_bundle({"text/plain": "<Figure>", "e2b/chart": chart,
                              "e2b/data": {"a": [1, 2]}, "application/json": 0})
    item: dict[str, object] = {}
    assert json_formats(res, 10_000, item) == []
    assert item == {"json": 0, "data": {"a": [1, 2]}, "chart": chart}
    item = {}
    notes = json_formats(res, 100, item)
    assert item == {"json": 0, "data": {"a": [1, 2]}}
    assert notes == [f"chart: {len(json.dumps(chart))} bytes of JSON, over the output "
                     "budget, left out"]


def test_chart_line_takes_only_strings_and_a_count() -> None:
    assert _chart_line(None) == "" and _chart_line({}) == ""
    assert _chart_line({"type": "bar", "title": "Sales", "elements": [1, 2]}) == \
        "\nchart: bar 'Sales', 2 elements"
    hostile = {"type": {"x": 1}, "title": "t" * 10_000, "elements": "not a list"}
    line = _chart_line(hostile)
    assert line.startswith("\nchart: unknown 'ttt") and len(line) < 250
