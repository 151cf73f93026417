"""Hostile MCP messages, generated deterministically (tool arguments from the input schemas
the server lists), each with what a correct server must answer.

``expect``: "id"    - a response with ``msg_id`` (error ``code`` if given; ``names``: a tool
                      argument the error must name);
            "null"  - an error with id null (``code`` if given);
            "batch" - an array of errors (or one error with id null);
            "none"  - no answer (a notification or a response).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
PARSE, INVALID, PARAMS, NOT_FOUND = -32700, -32600, -32602, -32601


@dataclass
class Case:
    label: str
    raw: bytes
    expect: str
    msg_id: Any = None
    code: int | None = None
    names: str | None = None  # the tool argument the (error) answer must name
    stdio_only: bool = False


class Lit:
    """A JSON literal spelled exactly (1e400, NaN, a 5000-digit integer)."""

    def __init__(self, text: str) -> None:
        self.text = text


def enc(obj: Any) -> bytes:
    """``obj`` as JSON, with ``Lit`` values spliced in verbatim."""
    lits: list[str] = []

    def swap(o: Any) -> Any:
        if isinstance(o, Lit):
            lits.append(o.text)
            return f"@@LIT{len(lits) - 1}@@"
        if isinstance(o, dict):
            return {k: swap(v) for k, v in o.items()}
        if isinstance(o, list):
            return [swap(v) for v in o]
        return o

    text = json.dumps(swap(obj))
    for i, lit in enumerate(lits):
        text = text.replace(f'"@@LIT{i}@@"', lit)
    return text.encode()


# A value for every numeric argument: (JSON text, the number it parses to or None if huge).
NUMBERS: list[tuple[str, float | None]] = [
    ("NaN", math.nan), ("Infinity", math.inf), ("-Infinity", -math.inf), ("1e400", math.inf),
    ("-1e400", -math.inf), ("-0", 0), ("-0.0", -0.0), (str(10 ** 30), 1e30),
    (str(2 ** 64), 2.0 ** 64), (str(-(2 ** 64)), -(2.0 ** 64)), ("9" * 5000, math.inf),
    ("-1", -1), ("1e-300", 1e-300), ("0.5", 0.5), ("1e308", 1e308),
]
SAMPLES = {"string": "x", "number": 1.5, "integer": 7, "boolean": True,
           "object": {"k": "v"}, "array": [1, "a"]}
BASE = {  # arguments that make each tool fail cheaply when the fuzzed one is valid
    "create_sandbox": {"template": "no-such-template-fuzz"},
    "run_code": {"code": "1", "sandbox_id": "sbx-fuzz000000"}, "run_command": {"command": "true"},
    "process_output": {"pid": 999999}, "kill_process": {"pid": 999999},
    "read_file": {"path": "/nonexistent-fuzz"}, "list_files": {"path": "/nonexistent-fuzz"},
    "write_file": {"path": "/tmp/fuzz.txt", "content": "x"},
    "set_network": {"network": "off", "sandbox_id": "sbx-fuzz000000"},
    "expose_port": {"port": 8000, "sandbox_id": "sbx-fuzz000000"},
}
SANDBOX_TOOLS = ("pause_sandbox", "resume_sandbox", "reset_rootfs", "kill_sandbox")


def _types(prop: dict[str, Any]) -> set[str]:
    kinds = prop.get("type", [])
    return {kinds} if isinstance(kinds, str) else set(kinds)


def _valid_number(prop: dict[str, Any], value: float | None) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if "integer" in _types(prop) and "number" not in _types(prop) and not float(value).is_integer():
        return False
    return prop.get("minimum", -math.inf) <= value <= prop.get("maximum", math.inf)


class Corpus:
    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.tools = {t["name"]: t["inputSchema"] for t in tools}
        self.ids = itertools.count(1000)
        self.cases: list[Case] = []

    def req(self, method: str, params: Any = None, extra: dict[str, Any] | None = None
            ) -> tuple[Any, dict[str, Any]]:
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        return msg_id, {**msg, **(extra or {})}

    def add(self, label: str, raw: bytes, expect: str, msg_id: Any = None, code: int | None = None,
            names: str | None = None, stdio_only: bool = False) -> None:
        self.cases.append(Case(label, raw, expect, msg_id, code, names, stdio_only))

    def call(self, label: str, tool: str, args: Any, *, names: str | None = None,
             code: int | None = None) -> None:
        msg_id, msg = self.req("tools/call", {"name": tool, "arguments": args})
        self.add(label, enc(msg), "id", msg_id, code, names)

    def base(self, tool: str) -> dict[str, Any]:
        if tool in SANDBOX_TOOLS:
            return {"sandbox_id": "sbx-fuzz000000"}
        return dict(BASE.get(tool, {}))

    # ---- the categories --------------------------------------------------------------------

    def depth(self) -> None:
        for d in (65, 100, 1000, 5000, 100_000):
            msg_id, msg = self.req("ping", {"x": Lit("[" * d + "]" * d)})
            self.add(f"array nested {d}", enc(msg), "id", msg_id, INVALID)
            msg_id, msg = self.req("ping", {"x": Lit('{"a":' * d + "1" + "}" * d)})
            self.add(f"object nested {d}", enc(msg), "id", msg_id, INVALID)
            self.add(f"bare array bomb {d}", b"[" * d + b"]" * d, "null", code=INVALID)
            self.add(f"unclosed bomb {d}", b'{"a":' * d, "null", code=INVALID)
            msg_id, msg = self.req("tools/call", {"name": "run_command",
                                                  "arguments": {"command": Lit("[" * d + "]" * d)}})
            self.add(f"nested argument {d}", enc(msg), "id", msg_id, INVALID)
        self.add("nested id", enc({"jsonrpc": "2.0", "id": Lit("[" * 500 + "]" * 500),
                                   "method": "ping"}), "null", code=INVALID)
        msg_id, msg = self.req("ping", {"_meta": {"x": Lit("[" * 55 + "]" * 55)}})
        self.add("nested 57 is fine", enc(msg), "id", msg_id)

    def surrogates(self) -> None:
        for s in ("\ud800", "\udfff", "a\udc00b", "\udc00\ud800"):
            tag = ascii(s)
            msg_id, msg = self.req(s)
            self.add(f"surrogate method {tag}", enc(msg), "id", msg_id, INVALID)
            self.add(f"surrogate id {tag}", enc({"jsonrpc": "2.0", "id": s, "method": "ping"}),
                     "null", code=INVALID)
            msg_id, msg = self.req("ping", {s: 1})
            self.add(f"surrogate key {tag}", enc(msg), "id", msg_id, PARAMS)
            msg_id, msg = self.req("ping", {"_meta": {"progressToken": s}})
            self.add(f"surrogate meta {tag}", enc(msg), "id", msg_id, PARAMS)
            msg_id, msg = self.req("tools/call", {"name": s, "arguments": {}})
            self.add(f"surrogate tool name {tag}", enc(msg), "id", msg_id, PARAMS)
            self.call(f"surrogate argument name {tag}", "run_command", {"command": "true", s: 1})
        for tool, schema in self.tools.items():
            for arg, prop in schema["properties"].items():
                if "string" in _types(prop):
                    self.call(f"surrogate {tool}.{arg}", tool,
                              {**self.base(tool), arg: "ok \ud800 text"}, names=arg)
        self.call("surrogate in envs value", "run_command",
                  {"command": "true", "envs": {"A": "\udfff"}}, names="envs")
        msg_id, msg = self.req("ping", {"s": "\\ud800 is text", "e": "\ud83d\ude00"})
        self.add("escaped backslash and a real pair are fine", enc(msg), "id", msg_id)

    def odd_ids(self) -> None:
        bad = ["1.5", "1.0", "-0.0", "1e400", "-1e400", "NaN", "Infinity", "true", "false",
               "null", "{}", '{"a":1}', "[]", "[1]", str(2 ** 63), str(-(2 ** 63)),
               str(10 ** 30), "9" * 5000, '"\\ud800"']
        for lit in bad:
            for method in ("ping", "tools/list", "notifications/initialized"):
                self.add(f"id {lit[:12]} on {method}", enc({"jsonrpc": "2.0", "id": Lit(lit),
                                                            "method": method}), "null",
                         code=INVALID)
            self.add(f"id {lit[:12]} on tools/call", enc(
                {"jsonrpc": "2.0", "id": Lit(lit), "method": "tools/call",
                 "params": {"name": "run_command", "arguments": {"command": "echo leak"}}}),
                "null", code=INVALID)
        good: list[Any] = [0, -1, 2 ** 63 - 1, -(2 ** 63 - 1), "", " ", "0", "null", "1.5",
                           "x" * 10_000, "\u2713", "\u0000", "a\nb", "\U0001f600"]
        for msg_id in good:
            self.add(f"valid id {str(msg_id)[:12]!r}", enc(
                {"jsonrpc": "2.0", "id": msg_id, "method": "ping"}), "id", msg_id)

    def numbers(self) -> None:
        for tool, schema in self.tools.items():
            for arg, prop in schema["properties"].items():
                if not _types(prop) & {"number", "integer"}:
                    continue
                for text, value in NUMBERS:
                    valid = _valid_number(prop, value)
                    self.call(f"{tool}.{arg}={text[:12]}", tool,
                              {**self.base(tool), arg: Lit(text)},
                              names=None if valid else arg)

    def wrong_types(self) -> None:
        for tool, schema in self.tools.items():
            required = set(schema.get("required", []))
            for arg, prop in schema["properties"].items():
                allowed = _types(prop) | ({"integer"} if "number" in _types(prop) else set())
                for kind, sample in SAMPLES.items():
                    if kind not in allowed and not (kind == "integer" and "number" in allowed):
                        self.call(f"{tool}.{arg} as {kind}", tool,
                                  {**self.base(tool), arg: sample}, names=arg)
                if arg in required:
                    self.call(f"{tool}.{arg} null", tool, {**self.base(tool), arg: None},
                              names=arg)
                if prop.get("additionalProperties") == {"type": "string"}:
                    self.call(f"{tool}.{arg} non-string value", tool,
                              {**self.base(tool), arg: {"A": 5}}, names=arg)
            self.call(f"{tool} unknown argument", tool, {**self.base(tool), "bogus": 1},
                      names="bogus")
        for args in ("x", [], 5, True):
            msg_id, msg = self.req("tools/call", {"name": "run_command", "arguments": args})
            self.add(f"arguments as {type(args).__name__}", enc(msg), "id", msg_id, PARAMS)
        for name in (5, None, [], {}):
            msg_id, msg = self.req("tools/call", {"name": name, "arguments": {}})
            self.add(f"tool name {name!r}", enc(msg), "id", msg_id, PARAMS)
        self.call("unknown tool", "no_such_tool", {})
        self.call("many unknown arguments", "run_command",
                  {"command": "true", **{f"bogus{i}": i for i in range(300)}}, names="bogus0")

    def huge(self) -> None:
        big = "a" * (3 * MIB)
        msg_id, msg = self.req(big)
        self.add("3 MiB method", enc(msg), "id", msg_id, NOT_FOUND)
        self.add("2 MiB id", enc({"jsonrpc": "2.0", "id": "i" * (2 * MIB), "method": "ping"}),
                 "id", "i" * (2 * MIB))
        for tool, arg in (("pause_sandbox", "sandbox_id"), ("read_file", "path"),
                          ("run_command", "workdir"), ("run_code", "context")):
            self.call(f"3 MiB {arg}", tool, {**self.base(tool), arg: big}, names=arg)
        self.call("3 MiB content", "write_file", {"path": "/tmp/fuzz-big.txt", "content": big})
        msg_id, msg = self.req("ping", {"_meta": {"pad": big}})
        self.add("3 MiB _meta", enc(msg), "id", msg_id)
        msg_id, msg = self.req("ping", {"pad": "b" * (9 * MIB)})
        self.add("9 MiB message", enc(msg), "id", msg_id, INVALID)

    def batches(self) -> None:
        self.add("empty batch", b"[]", "null", code=INVALID)
        pings = [self.req("ping")[1] for _ in range(3)]
        self.add("batch of pings", enc(pings), "batch")
        self.add("batch of one notification", enc([{"jsonrpc": "2.0", "method": "x/y"}]),
                 "batch")
        self.add("batch of numbers", b"[1,2,3]", "batch")
        self.add("nested batch", enc([pings]), "batch")
        self.add("batch of 500", enc([self.req("ping")[1] for _ in range(500)]), "batch")
        self.add("batch with a bad id", enc([{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}]),
                 "batch")

    def methods(self) -> None:
        for method in ("foo", "", "tools/nope", "rpc.discover", "resources/list",
                       "tasks/list", "x" * 300):
            msg_id, msg = self.req(method, {})
            self.add(f"unknown method {method[:20]!r}", enc(msg), "id", msg_id, NOT_FOUND)
        for method in ("notifications/initialized", "notifications/cancelled",
                       "notifications/progress", "notifications/roots/list_changed"):
            msg_id, msg = self.req(method, {"requestId": 1})
            self.add(f"{method} with an id", enc(msg), "id", msg_id, NOT_FOUND,
                     names="notification")
        for params in ([1], "x", 5, True):
            msg_id, msg = self.req("ping", Lit(json.dumps(params)))
            self.add(f"params {params!r}", enc(msg), "id", msg_id, PARAMS)
        for method, params in (("tools/list", {"cursor": 5}), ("tools/call", None),
                               ("tools/call", {"arguments": {}}), ("logging/setLevel", {}),
                               ("prompts/get", {}), ("completion/complete", {"ref": 5})):
            msg_id, msg = self.req(method, params)
            self.add(f"bad params for {method}", enc(msg), "id", msg_id)
        msg_id, msg = self.req("initialize", {"capabilities": "x"})
        self.add("initialize again, bad params", enc(msg), "id", msg_id, stdio_only=True)
        for note in ({"method": "notifications/cancelled", "params": {"requestId": {}}},
                     {"method": "foo/bar"}, {"method": "notifications/progress",
                                             "params": {"progressToken": [], "progress": "x"}}):
            self.add(f"notification {note['method']}", enc({"jsonrpc": "2.0", **note}), "none")
        for token in ("1.5", "true", "null", "{}", "[]", str(10 ** 30), '""', "-0", "NaN"):
            msg_id, msg = self.req("tools/call", {"name": "run_command", "arguments": {
                "command": "true"}, "_meta": {"progressToken": Lit(token)}})
            self.add(f"progress token {token[:12]}", enc(msg), "id", msg_id)
        self.add("response to nothing", enc({"jsonrpc": "2.0", "id": 99999, "result": {}}),
                 "none")

    def garbage(self) -> None:
        rng = random.Random(20261202)
        for i in range(25):
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
            raw = raw.replace(b"\n", b" ").strip() or b"\xff"
            self.add(f"random bytes #{i}", raw, "null")
        ping = b'{"jsonrpc":"2.0","id":5,"method":"ping"}'
        for label, raw, code in (
                ("0xff", b"\xff\xfe", PARSE), ("overlong", b'{"a":"\xc0\x80"}', PARSE),
                ("utf-8 surrogate", b'{"a":"\xed\xa0\x80"}', PARSE), ("NUL", b"\x00", PARSE),
                ("BOM", b"\xef\xbb\xbf" + ping, PARSE),
                ("UTF-16", ping.decode().encode("utf-16-le"), PARSE),
                ("open brace", b"{", PARSE), ("close brace", b"}", PARSE),
                ("trailing garbage", ping + b" xyz", PARSE), ("two objects", ping + ping, PARSE),
                ("control char", b'{"jsonrpc":"2.0","id":6,"method":"p\x01"}', PARSE),
                ("null", b"null", INVALID), ("true", b"true", INVALID), ("1", b"1", INVALID),
                ("string", b'"str"', INVALID), ("NaN", b"NaN", INVALID), ("{}", b"{}", INVALID),
                ("no id, no method", b'{"jsonrpc":"2.0"}', INVALID)):
            self.add(f"garbage: {label}", raw, "null", code=code)
        for label, extra in (("jsonrpc 1.0", {"jsonrpc": "1.0"}), ("no jsonrpc", {"jsonrpc": None}),
                             ("jsonrpc number", {"jsonrpc": 2.0}), ("method 5", {"method": 5}),
                             ("method null", {"method": None}), ("method object", {"method": {}})):
            msg_id, msg = self.req("ping", None, extra)
            msg = {k: v for k, v in msg.items() if v is not None or k == "method"}
            self.add(f"envelope: {label}", enc(msg), "id", msg_id, INVALID)
        self.add("id without method", enc({"jsonrpc": "2.0", "id": 77}), "id", 77, INVALID)
        self.add("result not an object", enc({"jsonrpc": "2.0", "id": 78, "result": 5}), "id",
                 78, INVALID)
        self.add("error without code", enc({"jsonrpc": "2.0", "id": 79, "error": {"c": 1}}),
                 "id", 79, INVALID)


def build(tools: list[dict[str, Any]]) -> list[Case]:
    corpus = Corpus(tools)
    for part in (corpus.depth, corpus.surrogates, corpus.odd_ids, corpus.numbers,
                 corpus.wrong_types, corpus.huge, corpus.batches, corpus.methods,
                 corpus.garbage):
        part()
    return corpus.cases
