"""Unit: the host's parsing of kernel bridge lines (hostile input), without a sandbox."""

from __future__ import annotations

from agent_sandbox.guestlink.kernel_cell import MAX_CELL_OUTPUT, MAX_DEPTH, CellOutput
from agent_sandbox.guestlink.kernel_channel import (
    CONTAINER_COST,
    MAX_CONTAINERS,
    MAX_EVENT,
    _Lines,
    parse_event,
)


def test_lines_are_split_and_overlong_ones_skipped() -> None:
    lines = _Lines()
    assert list(lines.feed(b'{"t": "a"}\n{"t"')) == [b'{"t": "a"}']
    assert list(lines.feed(b': "b"}\n')) == [b'{"t": "b"}']
    huge = b"x" * (MAX_EVENT + 10)
    assert list(lines.feed(huge[:100])) == []
    assert list(lines.feed(huge[100:])) == []  # skipped as it grows, never held whole
    assert list(lines.feed(b"tail\n{}\n")) == [b"{}"] and lines.overlong == 1


def test_parse_event_refuses_what_is_not_an_event() -> None:
    for line in (b"[1]", b"nonsense", b'{"t": 5}', b"\xff\xfe", b"[" * 100000,
                 b'{"t": "x", "n": ' + b"9" * 10000 + b"}", b'"t"'):
        assert parse_event(line) is None, line[:20]
    event = parse_event(b'{"t": "idle", "id": 1}')
    assert event is not None and (event["t"], event["id"]) == ("idle", 1)
    # NaN and Infinity, which Python's json reads but JSON has not: null.
    event = parse_event(b'{"t": "result", "data": {"e2b/chart": {"v": [NaN, -Infinity, 1]}}}')
    assert event is not None and event["data"]["e2b/chart"] == {"v": [None, None, 1]}
    # Parsed cost is charged: 50k empty lists cost far more than their 150 kB of text.
    many = b'{"t": "x", "a": [' + b"[]," * 50000 + b"[]]}"
    assert parse_event(many)["_bytes"] >= 50000 * CONTAINER_COST  # type: ignore[index]
    assert parse_event(b'{"t": "x", "a": [' + b"[]," * MAX_CONTAINERS + b"[]]}") is None


def test_cell_output_checks_types_and_caps() -> None:
    cell = CellOutput(None, None, None)
    for event in ({"t": "count", "n": "x"}, {"t": "count", "n": True},
                  {"t": "stream", "name": 5, "text": 7},
                  {"t": "result", "data": {"image/png": 5}, "_bytes": 10},
                  {"t": "result", "data": [1]},
                  {"t": "error", "ename": [1], "evalue": {}, "traceback": "x"},
                  {"t": "unknown"}):
        assert cell.apply(event) is False
    assert cell.apply({"t": "idle"}) is True
    ex = cell.finish(dropped=False)
    assert ex.execution_count is None and ex.results == [] and ex.truncated
    assert ex.error is not None and (ex.error.name, ex.error.value) == ("", "")

    cell = CellOutput(None, None, None)
    chunk = "y" * (1 << 20)
    for _ in range(MAX_CELL_OUTPUT // len(chunk) + 5):
        cell.apply({"t": "stream", "name": "stdout", "text": chunk})
    cell.apply({"t": "clear"})  # cleared output gives its room back
    cell.apply({"t": "stream", "name": "stderr", "text": "after"})
    ex = cell.finish(dropped=False)
    assert ex.stdout == "" and ex.stderr == "after" and ex.truncated


def test_cell_output_is_always_serializable() -> None:
    """Lone surrogates become U+FFFD everywhere; a bundle nested past MAX_DEPTH is
    dropped: what a cell returns always encodes as JSON for every client."""
    cell = CellOutput(None, None, None)
    deep: object = 1
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    cell.apply({"t": "stream", "name": "stdout", "text": "a\ud800b"})
    cell.apply({"t": "result", "data": {"application/json": deep}})
    cell.apply({"t": "result", "data": {"text/plain": "x\udfff", "x/y\ud800": ["\ud801"]}})
    cell.apply({"t": "error", "ename": "E\ud800", "evalue": "v", "traceback": ["\udc00"]})
    ex = cell.finish(dropped=False)
    assert ex.stdout == "a\ufffdb" and ex.truncated and len(ex.results) == 1
    assert ex.results[0].text == "x\ufffd" and ex.results[0].extra == {"x/y\ufffd": ["\ufffd"]}
    assert ex.error is not None and ex.error.name == "E\ufffd"
    ex.model_dump_json().encode()  # would raise on a lone surrogate or a 255-deep value


def test_data_and_chart_are_json_objects_or_their_result_is_dropped() -> None:
    """``e2b/data`` and ``e2b/chart`` are the sandbox's JSON, kept as they came (never
    read), but only as objects: a bundle with either as anything else is dropped."""
    cell = CellOutput(None, None, None)
    chart = {"type": "bar", "elements": [{"label": "a\ud800", "value": 1}], "x": None}
    cell.apply({"t": "result", "data": {"text/plain": "fig", "e2b/chart": chart,
                                        "image/png": "iVBO"}})
    cell.apply({"t": "result", "data": {"text/plain": "df", "e2b/data": {"a": [1, None]}}})
    for bad in ("a string", [1], 5, None, True):
        cell.apply({"t": "result", "data": {"text/plain": "bad", "e2b/chart": bad}})
        cell.apply({"t": "result", "data": {"text/plain": "bad", "e2b/data": bad}})
    ex = cell.finish(dropped=False)
    figure, frame, *rest = ex.results
    assert figure.chart == {"type": "bar", "elements": [{"label": "a\ufffd", "value": 1}],
                            "x": None}
    assert figure.formats() == ["text", "png", "chart"] and figure.extra == {}
    assert frame.data == {"a": [1, None]} and frame.formats() == ["text", "data"]
    # null is no format at all (as a missing one); every other wrong type is dropped.
    assert [r.formats() for r in rest] == [["text"], ["text"]] and ex.truncated
