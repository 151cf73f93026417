"""The Connect codecs envd's services decode requests with: connectrpc's own (protobuf
binary and ProtoJSON), made safe for hostile bodies.

- A request that does not decode is Connect's INVALID_ARGUMENT with a short message, not
  the ``unknown`` (HTTP 500) and logged traceback connectrpc makes of a decoder's error.
- JSON nested deeper than the standard library's parser goes (its recursion limit, ~1000
  levels) is refused before protobuf's native parser sees it: that one has no depth limit,
  and ``[[[...]]]`` 20,000 deep (80 KB) crashes the whole gateway (a C stack overflow)."""

from __future__ import annotations

import json
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError

_MAX_MESSAGE = 200  # characters of a decoder's error passed on (it may quote the input)
_DECODE_ERRORS = (ValueError, TypeError, RecursionError, OverflowError)


class _Checked:
    """connectrpc's codec ``inner`` (``kind``: how the error calls its format), decoding
    hostile input into INVALID_ARGUMENT."""

    def __init__(self, inner: Codec[Any, Any], kind: str) -> None:
        self._inner, self._kind = inner, kind

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Any) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        if self._inner.name() == "json":
            try:
                json.loads(data)  # in C, with a depth limit: the native parser has none
            except RecursionError:
                raise ConnectError(Code.INVALID_ARGUMENT,
                                   "the request's JSON is nested too deeply") from None
            except ValueError as exc:
                raise self._refused(message_class, exc) from None
        try:
            return self._inner.decode(data, message_class)
        except _DECODE_ERRORS as exc:
            raise self._refused(message_class, exc) from None

    def _refused(self, message_class: type[Any], exc: BaseException) -> ConnectError:
        text = str(exc)[:_MAX_MESSAGE] or type(exc).__name__
        return ConnectError(Code.INVALID_ARGUMENT, f"the request is not a valid "
                            f"{message_class.__name__} in {self._kind}: {text}")


def codecs() -> list[Codec[Any, Any]]:
    """What an envd service application is given (``codecs=``)."""
    return [_Checked(proto_binary_codec(), "protobuf binary"),  # type: ignore[list-item]
            _Checked(proto_json_codec(), "JSON")]  # type: ignore[list-item]
