"""A multipart/form-data body read part by part, each part's data as a stream: pulled from
a worker thread (the body is ``streaming.request_chunks``), so a part goes on to the sandbox
as it arrives and nothing holds a whole file, on disk or in memory (Starlette's
``request.form()`` would spool each to a temporary file on the host). python-multipart does
the parsing; what it hands over at a time is at most one body chunk."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from agent_sandbox.core.errors import InvalidArgumentError

MAX_HEADERS = 16 << 10  # bytes of headers one part may have
MAX_PARTS = 1000


def boundary(content_type: str) -> str:
    kind, options = parse_options_header(content_type)
    value = options.get(b"boundary")
    if kind != b"multipart/form-data" or not value:
        raise InvalidArgumentError("expected Content-Type multipart/form-data with a boundary")
    return value.decode("latin-1")


class Part:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        _, options = parse_options_header(headers.get("content-disposition", ""))
        self.name = _text(options.get(b"name"))
        self.filename = _text(options.get(b"filename"))


def _text(value: bytes | None) -> str | None:
    # parse_options_header reads headers as latin-1; clients send names as UTF-8.
    return None if value is None else value.decode("latin-1").encode("latin-1").decode(
        "utf-8", "replace")


class MultipartReader:
    """``parts()`` yields each part with an iterator of its data; a part's data not read
    by the time the next part is asked for is skipped."""

    def __init__(self, boundary_value: str, body: Iterator[bytes]) -> None:
        self._body = body
        self._events: deque[tuple[str, Any]] = deque()
        self._field = bytearray()
        self._value = bytearray()
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._ended = False
        self._parser = MultipartParser(boundary_value, callbacks={
            "on_part_begin": self._begin, "on_header_field": self._on_field,
            "on_header_value": self._on_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
            "on_part_data": lambda data, start, end: self._events.append(
                ("data", bytes(data[start:end]))),
            "on_part_end": lambda: self._events.append(("end", None)),
            "on_end": self._end})

    # python-multipart's callbacks ---------------------------------------------------------
    def _begin(self) -> None:
        self._headers, self._header_bytes = {}, 0

    def _grow(self, into: bytearray, data: bytes, start: int, end: int) -> None:
        self._header_bytes += end - start
        if self._header_bytes > MAX_HEADERS:
            raise InvalidArgumentError(f"a part's headers are longer than {MAX_HEADERS} bytes")
        into += data[start:end]

    def _on_field(self, data: bytes, start: int, end: int) -> None:
        self._grow(self._field, data, start, end)

    def _on_value(self, data: bytes, start: int, end: int) -> None:
        self._grow(self._value, data, start, end)

    def _header_end(self) -> None:
        self._headers[self._field.decode("latin-1").lower()] = self._value.decode("latin-1")
        self._field.clear()
        self._value.clear()

    def _headers_done(self) -> None:
        self._events.append(("part", Part(self._headers)))

    def _end(self) -> None:
        self._ended = True

    # pulling ------------------------------------------------------------------------------
    def _next(self) -> tuple[str, Any] | None:
        """The next parser event, reading more of the body for it; None at the end."""
        while not self._events:
            chunk = next(self._body, None)
            if chunk is None:
                if not self._ended:
                    raise InvalidArgumentError("the multipart body ended before its closing "
                                               "boundary")
                return None
            try:
                self._parser.write(chunk)
            except FormParserError as exc:
                raise InvalidArgumentError(f"malformed multipart body: {exc}") from None
        return self._events.popleft()

    def _data(self) -> Iterator[bytes]:
        while (event := self._next()) is not None and event[0] == "data":
            yield event[1]
        if event is None:
            raise InvalidArgumentError("the multipart body ended inside a part")

    def parts(self) -> Iterator[tuple[Part, Iterator[bytes]]]:
        count = 0
        while (event := self._next()) is not None:
            if event[0] != "part":
                continue  # data or end of a part already skipped
            count += 1
            if count > MAX_PARTS:
                raise InvalidArgumentError(f"more than {MAX_PARTS} parts in one upload")
            data = self._data()
            yield event[1], data
            for _ in data:  # what the consumer left
                pass
