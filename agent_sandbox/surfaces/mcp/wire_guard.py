"""The checks every incoming JSON-RPC document passes before anything else touches it.

Both transports (STDIO lines, HTTP POST bodies) run ``inspect`` on the raw bytes first:

* size: at most ``limit`` bytes (8 MiB);
* encoding: strict UTF-8;
* nesting: at most ``MAX_DEPTH`` levels, measured on the raw text *before* parsing, so a
  document nested thousands deep never reaches a recursive parser;
* syntax: ``json`` (NaN/Infinity literals are let through for the tools to name; an integer
  too long to convert cheaply becomes a float, i.e. Infinity);
* no unpaired UTF-16 surrogate (``"\\ud800"``) anywhere: such a string cannot be encoded back
  to UTF-8, so it is refused naming the field;
* the JSON-RPC 2.0 envelope: an object with ``"jsonrpc": "2.0"``, an ``id`` that is a string
  or an integer (never null, a float, a boolean, an object or an array), a string
  ``method``, an object ``params``; batches (arrays) are refused, each request in them
  answered with its own -32600 error (MCP removed batching in 2025-06-18).

What comes out is either the parsed message (a dict) or the JSON-RPC reply to send instead.
The reply's text never echoes raw input: names are shown with ``ascii()``, values capped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import mcp_types as types
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agent_sandbox.surfaces.mcp.early_stdio import STDIO_DEFAULT_VERSION

# What a bare `initialize` is taken to ask for, per transport (each one's oldest version).
HTTP_DEFAULT_VERSION = "2025-03-26"
MAX_DEPTH = 64
MAX_ID = (1 << 63) - 1  # integer ids must fit in a signed 64-bit integer
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
# Converting a long digit string to an int is quadratic: longer ones become floats.
_INT_DIGITS = 400

# Linear-time patterns only (no nested repetition). The scans work on the raw bytes: every
# character that matters is ASCII, and UTF-8 never puts an ASCII byte inside a character.
_ESCAPE = re.compile(rb"\\.", re.S)
_KEEP_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1
_OPEN_RUN = re.compile(rb"[\[{]{" + str(MAX_DEPTH + 1).encode() + rb"}")
# Every escape but a lone surrogate: a high+low pair, any other \uXXXX, any other \x.
_HARMLESS_ESCAPE = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|u(?![dD][89a-fA-F])[0-9a-fA-F]{4}|[^u])", re.S)
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_TOKEN = re.compile(r'\\.|["\[\]{}]', re.S)
_COLON = re.compile(r"\s*:\s*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# Best effort: the id of a message too large to parse, from its first bytes.
_ID_NEAR_START = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[ -!#-\[\]-~]{0,200}")')
_DECODER = json.JSONDecoder()


@dataclass
class Verdict:
    """``message`` to serve, or ``reply`` (a JSON-able error, or a list of them) to send."""

    message: dict[str, Any] | None = None
    reply: Any = None


def error(code: int, message: str, msg_id: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def dumps(reply: Any) -> bytes:
    """A reply as compact ASCII JSON (any stray surrogate escaped, never raising)."""
    return json.dumps(reply, separators=(",", ":"), default=str).encode()


def has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def valid_id(value: Any) -> bool:
    if isinstance(value, str):
        return not has_surrogate(value)
    return type(value) is int and -MAX_ID <= value <= MAX_ID


def id_near_start(head: bytes) -> Any:
    """The id of an oversized message if its first bytes show one, else None."""
    found = _ID_NEAR_START.search(head)
    if not found:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return None
    return value if valid_id(value) else None


def describe_id_problem(value: Any) -> str:
    if value is None:
        return "'id' must not be null (MCP requires a string or an integer id)"
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, float):
        if value in (float("inf"), float("-inf")):
            return "'id' is out of range: integer ids must fit in 64 bits"
        kind = "a floating-point number" if value == value else "NaN"
    elif isinstance(value, int):
        return "'id' is out of range: integer ids must fit in 64 bits"
    elif isinstance(value, str):
        return "'id' contains an unpaired UTF-16 surrogate"
    elif isinstance(value, dict):
        kind = "an object"
    elif isinstance(value, list):
        kind = "an array"
    else:
        kind = type(value).__name__
    return f"'id' must be a string or an integer, got {kind}"


def max_depth(raw: bytes) -> int:
    """How deep the document nests arrays and objects, from its raw bytes."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return MAX_DEPTH  # cannot be deeper: skip the scan
    # Escapes out, then every other quote-separated piece is a string's inside.
    outside = b"".join(_ESCAPE.sub(b"", raw).split(b'"')[0::2])
    brackets = outside.translate(None, _KEEP_BRACKETS)
    if _OPEN_RUN.search(brackets):
        return MAX_DEPTH + 1  # the usual bomb, found at C speed
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def has_lone_surrogate(raw: bytes) -> bool:
    """Exactly: does some string in the document decode to an unpaired surrogate?"""
    if b"\\u" not in raw:
        return False
    return _LONE_SURROGATE_ESCAPE.search(_HARMLESS_ESCAPE.sub(b"", raw)) is not None


def top_level_id(text: str, budget: int = 100_000) -> Any:
    """The top-level ``id`` of a document we refuse to parse (None when not found within
    ``budget`` tokens)."""
    depth, opened = 0, -1  # opened: where the string being read started (-1: none)
    for n, m in enumerate(_TOKEN.finditer(text)):
        if n > budget:
            return None
        tok = m.group()
        if opened >= 0:
            if tok != '"':
                continue  # an escape or a bracket inside a string
            key, opened = text[opened:m.end()], -1
            colon = _COLON.match(text, m.end())
            if depth == 1 and key == '"id"' and colon:
                return _scalar_id(text, colon.end())
        elif tok == '"':
            opened = m.start()
        elif tok in "[{":
            depth += 1
        elif tok in "]}":
            depth -= 1
    return None


def _scalar_id(text: str, start: int) -> Any:
    if text[start:start + 1] in ("[", "{", ""):
        return None  # an array or object is no id, and may be deep
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    return value if valid_id(value) else None


def _parse_int(digits: str) -> int | float:
    return int(digits) if len(digits) <= _INT_DIGITS else float(digits)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
    # An integer too long to convert cheaply: such integers become floats (Infinity).
    return json.loads(text, parse_int=_parse_int)


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    shown = ascii(key if len(key) <= 64 else key[:64] + "...")
    return f"{path}[{shown}]"


def find_surrogate(value: Any) -> tuple[list[Any], bool] | None:
    """Where the first unpaired surrogate is: (path of keys/indexes, in a member name?)."""
    if isinstance(value, str):
        return [], False
    path: list[Any] = []
    stack = [iter(value.items() if isinstance(value, dict) else enumerate(value))]
    while stack:
        for key, item in stack[-1]:
            if isinstance(key, str) and has_surrogate(key):
                return [*path, key], True
            if isinstance(item, str):
                if has_surrogate(item):
                    return [*path, key], False
            elif isinstance(item, dict | list):
                path.append(key)
                stack.append(iter(item.items() if isinstance(item, dict) else enumerate(item)))
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def _dotted(path: list[Any]) -> str:
    text = ""
    for part in path:
        text = _join(text, part)
    return text or "the message"


def _surrogate_reply(obj: Any, msg_id: Any) -> dict[str, Any] | None:
    found = find_surrogate(obj)
    if found is None:
        return None
    path, in_name = found
    what = f"the member name {_dotted(path)}" if in_name else _dotted(path)
    why = ("contains an unpaired UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), "
           "which is not valid Unicode")
    if not path or path[0] != "params":
        return error(INVALID_REQUEST, f"Invalid Request: {what} {why}", msg_id)
    if obj.get("method") == "tools/call" and path[:2] == ["params", "arguments"] and \
            len(path) > 2:
        name = str(path[2])
        arg = (f"argument name {ascii(name[:64])}" if in_name and len(path) == 3 else
               f"argument {ascii(name[:64])}")
        return error(INVALID_PARAMS, f"Invalid params: tools/call {arg} ({what}) {why}; send "
                     "valid text (binary data as base64)", msg_id)
    return error(INVALID_PARAMS, f"Invalid params: {what} {why}", msg_id)


def check_envelope(obj: Any) -> dict[str, Any] | None:
    """The -32600/-32602 error for a message that is not a JSON-RPC 2.0 message, or None."""
    if not isinstance(obj, dict):
        kind = {str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(obj), "a number")
        return error(INVALID_REQUEST, f"Invalid Request: a message must be a JSON object, "
                     f"got {kind}")
    has_id = "id" in obj
    msg_id = obj.get("id")
    if has_id and not valid_id(msg_id):
        return error(INVALID_REQUEST, f"Invalid Request: {describe_id_problem(msg_id)}")
    answer_id = msg_id if has_id else None
    if obj.get("jsonrpc") != "2.0":
        return error(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', answer_id)
    if "method" in obj:
        if not isinstance(obj["method"], str):
            return error(INVALID_REQUEST, "Invalid Request: 'method' must be a string",
                         answer_id)
        if "params" in obj and not isinstance(obj["params"], dict | None):
            return error(INVALID_PARAMS, "Invalid params: 'params' must be an object",
                         answer_id)
        return None
    if not has_id or not ("result" in obj or "error" in obj):
        return error(INVALID_REQUEST, "Invalid Request: a message needs a 'method' (request "
                     "or notification), or an 'id' with 'result' or 'error' (response)",
                     answer_id)
    try:
        types.jsonrpc_message_adapter.validate_python(obj, by_name=False)
    except ValidationError:
        return error(INVALID_REQUEST, "Invalid Request: a response needs 'result' as an "
                     "object, or 'error' as an object with an integer 'code' and a string "
                     "'message'", answer_id)
    return None


def _batch_reply(items: list[Any], where: str) -> Any:
    if not items:
        return error(INVALID_REQUEST, "Invalid Request: empty batch")
    why = ("Invalid Request: JSON-RPC batches are not supported (MCP removed them in "
           f"2025-06-18); send each message {where}")
    replies = []
    for item in items:
        if isinstance(item, dict) and "id" in item:
            replies.append(error(INVALID_REQUEST, why, item["id"] if valid_id(item["id"])
                                 else None))
        elif not (isinstance(item, dict) and isinstance(item.get("method"), str)):
            replies.append(error(INVALID_REQUEST, why))
    # Notifications get no entry; a batch of only notifications still hears why.
    return replies or error(INVALID_REQUEST, why)


def inspect(raw: bytes, limit: int, where: str = "on its own line") -> Verdict:
    """Check one incoming document (``where`` says how to send messages one by one)."""
    if len(raw) > limit:
        return Verdict(reply=error(INVALID_REQUEST, f"Invalid Request: message larger than "
                                   f"{limit} bytes", id_near_start(raw[:1024])))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Verdict(reply=error(PARSE_ERROR, f"Parse error: the message is not valid "
                                   f"UTF-8 (bad byte at offset {exc.start})"))
    if not text.strip():
        return Verdict(reply=error(PARSE_ERROR, "Parse error: the message is empty"))
    if max_depth(raw) > MAX_DEPTH:
        return Verdict(reply=error(INVALID_REQUEST, f"Invalid Request: JSON nested deeper "
                                   f"than {MAX_DEPTH} levels", top_level_id(text)))
    try:
        obj = _loads(text)
    except json.JSONDecodeError as exc:
        return Verdict(reply=error(PARSE_ERROR, f"Parse error: not valid JSON ({exc.msg} at "
                                   f"line {exc.lineno} column {exc.colno})"))
    except (ValueError, RecursionError):
        return Verdict(reply=error(PARSE_ERROR, "Parse error: not valid JSON"))
    if isinstance(obj, list):
        return Verdict(reply=_batch_reply(obj, where))
    problem = check_envelope(obj)
    if problem is None and has_lone_surrogate(raw):
        problem = _surrogate_reply(obj, obj.get("id"))  # a valid id: checked above
    if problem is not None:
        return Verdict(reply=problem)
    return Verdict(message=obj)


def settle_initialize(obj: dict[str, Any], default_version: str = STDIO_DEFAULT_VERSION) -> None:
    """Fill what a bare ``initialize`` lacks; a missing or unknown version is taken as the
    transport's oldest (STDIO 2024-11-05, Streamable HTTP 2025-03-26)."""
    params = obj.get("params")
    if not isinstance(params, dict):
        params = obj["params"] = {}
    if params.get("protocolVersion") not in HANDSHAKE_PROTOCOL_VERSIONS:
        params["protocolVersion"] = default_version
    params.setdefault("capabilities", {})
    params.setdefault("clientInfo", {"name": "unknown", "version": "0"})
