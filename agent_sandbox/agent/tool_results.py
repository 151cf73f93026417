"""Every tool's ``outputSchema``: the shape of the ``structuredContent`` it returns.

Schemas are plain JSON Schema objects in the dialect every client takes: one ``type`` per
property (never a list of types), no ``$ref``/``anyOf``. A value that may be null (an exit
code while a command still runs) has no ``type`` and says so in its description. Extra
properties are allowed, so a field added later never breaks a client that validates.
Errors (``isError`` results) carry ``{"error": {...}}`` and are not validated by clients.
The MCP end-to-end tests call every tool through the official client, which checks each
result against these schemas.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _t(kind: str, description: str = "") -> Schema:
    return {"type": kind, **({"description": description} if description else {})}


def _nullable(description: str) -> Schema:
    return {"description": description + " (null when not applicable)"}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    return {"type": "object", "properties": {**required, **(optional or {})},
            "required": list(required)}


STR, INT, NUM, BOOL = _t("string"), _t("integer"), _t("number"), _t("boolean")
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
NETWORK = obj({"mode": _t("string", "off, allowlist or full"),
               "allow_out": {"type": "array", "items": STR},
               "deny_out": {"type": "array", "items": STR}})
SANDBOX = obj({
    "sandbox_id": STR, "template": STR, "state": _t("string", "running or paused"),
    "created_at": _t("number", "Unix time"), "last_used": _t("number", "Unix time"),
    "timeout": _t("number", "idle seconds before it is auto-paused"),
    "expires_at": _t("number", "Unix time it is auto-paused unless used"),
    "persistent": BOOL, "network": NETWORK, "volume_id": STR, "metadata": STR_MAP,
    "env_names": {"type": "array", "items": STR},
}, {"limits": _t("object"), "enforced": _t("object"), "owner": STR})
STREAMS = {"stdout": STR, "stderr": STR,
           "truncated": _t("boolean", "output was cut to the budget"),
           "full_output": {**STR_MAP, "description": "stream name -> path of the whole "
                           "output saved in the sandbox, for cut streams"}}
ONE_SANDBOX = obj({"sandbox": SANDBOX})
RESULT = obj({"is_main_result": BOOL, "formats": {"type": "array", "items": STR}},
             {f: STR for f in ("text", "html", "markdown", "svg", "latex", "png", "jpeg")})
ENTRY = obj({"path": STR, "name": STR, "type": _t("string", "file, dir, symlink or other"),
             "size": INT, "mode": INT, "mtime": NUM},
            {"symlink_target": _nullable("where a link points")})

OUTPUT_SCHEMAS: dict[str, Schema] = {
    "create_sandbox": obj({"sandbox": SANDBOX,
                           "default": _t("boolean", "it became the session's default")}),
    "list_sandboxes": obj({"sandboxes": {"type": "array", "items": SANDBOX},
                           "default": _nullable("the session's default sandbox id")}),
    "run_code": obj({
        "sandbox_id": STR, "context": STR,
        "execution_count": _nullable("the cell's number in its context"),
        **STREAMS, "results": {"type": "array", "items": RESULT},
        "error": _nullable("the exception raised: name, value, traceback"),
        "kernel_restarted": BOOL, "duration_ms": NUM}),
    "run_command": obj({"sandbox_id": STR}, {
        "pid": _t("integer", "with background=true: the command's pid"),
        "background": BOOL, "exit_code": _nullable("the command's exit status"),
        **STREAMS, "timed_out": BOOL, "duration_ms": NUM}),
    "process_output": obj({
        "sandbox_id": STR, "pid": INT, "running": BOOL,
        "exit_code": _nullable("the exit status once it ended"), **STREAMS}),
    "kill_process": obj({"sandbox_id": STR, "pid": INT,
                         "killed": _t("boolean", "false when it had already ended")}),
    "read_file": obj({
        "sandbox_id": STR, "path": STR, "encoding": STR, "offset": INT, "bytes": INT,
        "content": STR, "truncated": BOOL,
        "next_offset": _nullable("where to read on when the file continues")}),
    "write_file": obj({"sandbox_id": STR, "path": STR, "bytes": INT,
                       "mode": _t("string", "octal, e.g. 0644")}),
    "list_files": obj({"sandbox_id": STR, "path": STR, "entries": {"type": "array",
                                                                   "items": ENTRY},
                       "truncated": BOOL, "total": INT}),
    "set_network": ONE_SANDBOX,
    "pause_sandbox": ONE_SANDBOX,
    "resume_sandbox": ONE_SANDBOX,
    "reset_rootfs": ONE_SANDBOX,
    "expose_port": obj({"sandbox_id": STR, "port": INT,
                        "url": _t("string", "where the port is reached from")}),
    "kill_sandbox": obj({"sandbox_id": STR, "killed": BOOL, "volume_deleted": BOOL}),
}
