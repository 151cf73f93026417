"""Every tool's ``outputSchema``: the shape of the ``structuredContent`` it returns.

Schemas are plain JSON Schema objects in the dialect every client takes: every property
has one ``type`` (never a list of types), no ``$ref``/``anyOf``/``oneOf`` (strict dialects
such as Gemini's refuse them), so MCP Inspector's ``--strict`` lint finds nothing. A value
that does not apply (an exit code while a command still runs) is left out, never null.
Extra properties are allowed, so a field added later never breaks a client that validates.

A failed call (``isError``) carries ``{"error": {"code", "message", ...}}`` and nothing
else, and that too conforms to the tool's schema, as the spec requires of every structured
result: the TypeScript SDK 1.x validates error results as well, and turned every tool error
into "Structured content does not match the tool's output schema". Without a union, one
schema admits both shapes only if no field is required, so the fields a success always has
are named in the schema's description instead; ``error`` is one more property (for
``run_code``, the same property as the cell's exception). Detail fields of an error
(``retry_after`` of ``busy``) sit inside ``error``, typed.

The MCP end-to-end tests call every tool through the official clients, which check each
result against these schemas.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _t(kind: str, description: str = "") -> Schema:
    return {"type": kind, **({"description": description} if description else {})}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    return {"type": "object", "properties": {**required, **(optional or {})},
            "required": list(required)}


STR, INT, NUM, BOOL = _t("string"), _t("integer"), _t("number"), _t("boolean")
STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

# The error of a failed call (isError), for every tool.
_ERROR_FIELDS: dict[str, Schema] = {
    "code": _t("string", "what failed, for programs: invalid_argument, not_found, "
                         "wrong_state, permission_denied, resource_exhausted, timeout, "
                         "locked, conflict, runtime_unavailable, internal ..."),
    "message": _t("string", "what failed and how to fix it (the text the model sees)"),
    "details": _t("object", "facts about the failure, by name"),
    "retry_after": _t("number", "seconds to wait before calling again (a busy server, a "
                                "locked file)"),
}
ERROR = {**obj({k: _ERROR_FIELDS[k] for k in ("code", "message")},
               {k: _ERROR_FIELDS[k] for k in ("details", "retry_after")}),
         "description": "why the call failed; present only on failed calls (isError)"}


def result(fields: dict[str, Schema], optional: dict[str, Schema] | None = None, *,
           error: Schema = ERROR) -> Schema:
    """A tool's output schema: ``fields`` are always there on success, ``optional`` only
    where they apply; a failed call carries ``error`` alone (so nothing is ``required``)."""
    return {
        "type": "object",
        "description": f"On success: {', '.join(fields)}"
                       + (f"; where they apply: {', '.join(optional)}" if optional else "")
                       + ". A failed call (isError) has only error.",
        "properties": {**fields, **(optional or {}), "error": error},
    }


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
}, {"limits": _t("object"), "enforced": _t("object"), "owner": STR,
    "lifetime": _t("number", "seconds from its start to its end (only when it has one)"),
    "ends_at": _t("number", "Unix time its lifetime ends it (only when it has one)"),
    "on_timeout": _t("string", "what its idle timeout does: pause or kill"),
    "keep_volume": _t("boolean", "an end it comes to by itself keeps its volume")})
STREAMS = {"stdout": STR, "stderr": STR,
           "truncated": _t("boolean", "output was cut to the budget"),
           "full_output": {**STR_MAP, "description": "stream name -> path of the whole "
                           "output saved in the sandbox, for cut streams"}}
ONE_SANDBOX = result({"sandbox": SANDBOX})
RESULT = obj({"is_main_result": BOOL, "formats": {"type": "array", "items": STR}},
             {**{f: STR for f in ("text", "html", "markdown", "svg", "latex", "png", "jpeg")},
              "data": _t("object", "a pandas DataFrame's columns, each a list"),
              "chart": _t("object", "a matplotlib figure's chart (E2B's result.chart): "
                                    "type, title, elements, labels, scales, ticks")})
ENTRY = obj({"path": STR, "name": STR, "type": _t("string", "file, dir, symlink or other"),
             "size": INT, "mode": INT, "mtime": NUM},
            {"symlink_target": _t("string", "where a link points (links only)"),
             "version": _t("string", "a file's version (files only): write_file's if_match")})
# run_code's `error` is the cell's exception on success, the call's error on failure.
CELL_ERROR = {
    "type": "object",
    "description": "the exception the cell raised (name, value, traceback), left out when "
                   "it raised none; or, for a failed call (isError), why it failed (code, "
                   "message)",
    "properties": {"name": _t("string", "the exception's class, e.g. ZeroDivisionError"),
                   "value": _t("string", "its message"), "traceback": STR, **_ERROR_FIELDS},
}

TEMPLATE = obj({
    "name": STR, "kind": _t("string", "base, code-interpreter, recipe, oci, dir..."),
    "description": STR, "has_kernel": _t("boolean", "run_code works in its sandboxes"),
    "workdir": STR, "default": _t("boolean", "the template create_sandbox uses without one")},
    {"parent": _t("string", "the template a recipe template was built on"),
     "layers": _t("integer", "a recipe template's own layers"),
     "size_bytes": _t("integer", "their bytes"), "created_at": _t("number", "Unix time")})

OUTPUT_SCHEMAS: dict[str, Schema] = {
    "list_templates": result({"templates": {"type": "array", "items": TEMPLATE}}),
    "create_sandbox": result({"sandbox": SANDBOX,
                              "default": _t("boolean", "it became the session's default")}),
    "list_sandboxes": result({"sandboxes": {"type": "array", "items": SANDBOX}},
                             {"default": _t("string", "the session's default sandbox id")}),
    "run_code": result({
        "sandbox_id": STR, "context": STR, **STREAMS,
        "results": {"type": "array", "items": RESULT},
        "kernel_restarted": BOOL, "duration_ms": NUM},
        {"execution_count": _t("integer", "the cell's number in its context")},
        error=CELL_ERROR),
    "run_command": result({"sandbox_id": STR}, {
        "pid": _t("integer", "with background=true: the command's pid"),
        "background": BOOL, "exit_code": _t("integer", "the command's exit status"),
        **STREAMS, "timed_out": BOOL, "duration_ms": NUM}),
    "process_output": result({
        "sandbox_id": STR, "pid": INT, "running": BOOL, **STREAMS},
        {"exit_code": _t("integer", "the exit status, once it ended")}),
    "kill_process": result({"sandbox_id": STR, "pid": INT,
                            "killed": _t("boolean", "false when it had already ended")}),
    "read_file": result({
        "sandbox_id": STR, "path": STR, "encoding": STR, "offset": INT, "bytes": INT,
        "content": STR, "truncated": BOOL},
        {"next_offset": _t("integer", "where to read on, when the file continues"),
         "version": _t("string", "the file's version: write_file's if_match")}),
    "write_file": result({"sandbox_id": STR, "path": STR, "bytes": INT,
                          "mode": _t("string", "octal, e.g. 0644")}),
    "list_files": result({"sandbox_id": STR, "path": STR,
                          "entries": {"type": "array", "items": ENTRY},
                          "truncated": BOOL, "total": INT}),
    "set_network": ONE_SANDBOX,
    "pause_sandbox": ONE_SANDBOX,
    "resume_sandbox": ONE_SANDBOX,
    "reset_rootfs": ONE_SANDBOX,
    "expose_port": result({"sandbox_id": STR, "port": INT,
                           "url": _t("string", "where the port is reached from")},
                          {"share_url": _t("string", "through a gateway: a link a person's "
                                                     "browser can open (a token that "
                                                     "expires)")}),
    "kill_sandbox": result({"sandbox_id": STR, "killed": BOOL, "volume_deleted": BOOL}),
    "lock_file": result({"sandbox_id": STR, "path": STR,
                         "token": _t("string", "write_file's lock_token; unlock_file's token"),
                         "holder": _t("string", "who holds it (this session)"),
                         "expires_in": _t("number", "seconds until it lapses")}),
    "unlock_file": result({"sandbox_id": STR, "path": STR, "unlocked": BOOL}),
    "snapshot_sandbox": result({"snapshot": obj({
        "snapshot_id": STR, "name": STR,
        "sandbox_id": _t("string", "the sandbox it was taken of"), "template": STR,
        "created_at": _t("number", "Unix time"),
        "size_bytes": _t("integer", "host disk it takes"), "owner": STR})}),
}
