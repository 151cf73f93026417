"""E2B's template API on the gateway: what ``Template.build`` of E2B's SDKs calls
(``POST /v3/templates``, the files of each ``copy`` uploaded by their hash, ``POST
/v2/templates/{id}/builds/{build}``, its status and logs polled), and template list, get,
delete and aliases. A build becomes a recipe (``core/recipe.py``) built by the engine like
``abx template build --file``: a cached layer per step, each RUN in a sandbox. The same
tenancy as sandboxes: a key sees the host's templates and its own.

Uploads go to a URL of this gateway carrying a one-build secret (E2B's SDK sends no key
with them, as to a presigned bucket URL), streamed to a bounded file per key and hash."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SandboxError,
)
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.core.templates import BASE, CODE_INTERPRETER, NAME_PATTERN
from agent_sandbox.surfaces.e2b import envd
from agent_sandbox.surfaces.e2b.catalog import (
    Tags,
    check_tags,
    e2b_time,
    split_ref,
    template,
    visible,
)
from agent_sandbox.surfaces.http.auth import Principal, principal
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.routes.templates import check_build_network

MAX_UPLOAD = 1 << 30  # bytes of one copy's files (its tar, as uploaded)
MAX_KEPT = 4 << 30  # bytes of uploads kept per key (the oldest go first)
MAX_LOG_ENTRIES = 100  # per status answer, as E2B's
MAX_LOG_KEPT = 20_000  # log entries a build keeps (then only its errors)
MAX_LOG_LINE = 4096  # characters of one
MAX_BUILDS_KEPT = 1000  # builds remembered; the oldest finished ones are forgotten
_HASH = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(NAME_PATTERN)
# E2B's own base images are this host's templates (their tools come from the host's OS).
_E2B_IMAGES = {"e2bdev/base": BASE, "e2bdev/code-interpreter": CODE_INTERPRETER}
router = APIRouter()


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class BuildRequest(_Body):
    name: str | None = Field(None, max_length=200)
    alias: str | None = Field(None, max_length=200)
    tags: list[str] | None = None
    cpu_count: int | None = Field(None, alias="cpuCount")
    memory_mb: int | None = Field(None, alias="memoryMB")


class Step(_Body):
    type: str
    args: list[str] = []
    force: bool | None = None
    files_hash: str | None = Field(None, alias="filesHash")


class BuildStart(_Body):
    from_image: str | None = Field(None, alias="fromImage")
    from_template: str | None = Field(None, alias="fromTemplate")
    from_image_registry: dict[str, Any] | None = Field(None, alias="fromImageRegistry")
    force: bool | None = None
    steps: list[Step] = Field([], max_length=500)
    start_cmd: str | None = Field(None, alias="startCmd")
    ready_cmd: str | None = Field(None, alias="readyCmd")


@dataclass
class Build:
    template: str
    build_id: str
    owner: str
    tags: list[str] = field(default_factory=list)  # given with the request, kept once built
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    status: str = "waiting"  # waiting | building | ready | error
    logs: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    started: float = field(default_factory=time.time)


class Builds:
    """The builds this gateway runs or ran (in memory: a restarted gateway forgets them,
    as a client's poll then says)."""

    def __init__(self, files: Path) -> None:
        self.files = files
        self.by_id: dict[str, Build] = {}
        self.lock = threading.Lock()

    def get(self, who: Principal, template: str, build_id: str) -> Build:
        found = self.by_id.get(build_id)
        if found is None or found.template != template or found.owner != who.owner:
            raise NotFoundError(f"build {build_id} of template {template!r} not found")
        return found

    def folder(self, owner: str) -> Path:
        return self.files / hashlib.sha256(owner.encode()).hexdigest()[:16]


def _gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


def _builds(request: Request) -> Builds:
    state = request.app.state
    if getattr(state, "template_builds", None) is None:
        state.template_builds = Builds(state.gateway.keys.path.parent / "e2b-template-files")
    return state.template_builds


State = Annotated[GatewayState, Depends(_gateway)]
Caller = Annotated[Principal, Depends(principal)]
BuildsDep = Annotated[Builds, Depends(_builds)]


def _e2b_template(info: TemplateInfo) -> dict[str, Any]:
    at = e2b_time(info.created_at)
    return {"templateID": info.name, "buildID": info.name, "cpuCount": 1, "memoryMB": 1024,
            "diskSizeMB": 1024, "public": not info.owner, "aliases": [info.name],
            "names": [info.name], "createdAt": at, "updatedAt": at, "createdBy": None,
            "lastSpawnedAt": None, "spawnCount": 0, "buildCount": 1, "buildStatus": "ready",
            "envdVersion": envd.VERSION}


# ---- building --------------------------------------------------------------------------
@router.post("/v3/templates", status_code=202)
@router.post("/v2/templates", status_code=202)
def request_build(body: BuildRequest, state: State, who: Caller, builds: BuildsDep
                  ) -> dict[str, Any]:
    name, tag = split_ref(body.name or body.alias or "")
    tags = check_tags([*(body.tags or []), tag])
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"template name {name!r}: use 1-63 lowercase letters, "
                                   "digits, '.', '_' or '-'")
    for info in state.provider.list_templates():
        if info.name == name and not (info.owner == who.owner or (who.admin and not info.owner)):
            raise PermissionDeniedError(f"template {name!r} belongs to another tenant")
    build = Build(template=name, build_id=str(uuid.uuid4()), owner=who.owner, tags=tags)
    with builds.lock:
        builds.by_id[build.build_id] = build
        if len(builds.by_id) > MAX_BUILDS_KEPT:
            done = [b for b in builds.by_id.values() if b.status != "building"]
            for old in sorted(done, key=lambda b: b.started)[:len(builds.by_id) -
                                                                MAX_BUILDS_KEPT]:
                del builds.by_id[old.build_id]
    return {"templateID": name, "buildID": build.build_id, "public": False, "names": [name],
            "tags": tags, "aliases": [name]}


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
def file_link(template_id: str, files_hash: str, request: Request, who: Caller,
              builds: BuildsDep) -> dict[str, Any]:
    if not _HASH.fullmatch(files_hash):
        raise InvalidArgumentError("the files hash must be 64 lowercase hex digits")
    build = next((b for b in builds.by_id.values() if b.template == template_id
                  and b.owner == who.owner and b.status == "waiting"), None)
    if build is None:
        raise NotFoundError(f"no build of template {template_id!r} is waiting for files")
    present = (builds.folder(who.owner) / f"{files_hash}.tar").is_file()
    url = str(request.url_for("upload_files", template_id=template_id,
                              files_hash=files_hash).include_query_params(
        build=build.build_id, secret=build.secret))
    return {"present": present, "url": url}


@router.put("/templates/{template_id}/files/{files_hash}/upload", name="upload_files",
            status_code=200, max_body_size=MAX_UPLOAD)
async def upload_files(template_id: str, files_hash: str, request: Request,
                       builds: BuildsDep, build: str = Query(), secret: str = Query()
                       ) -> Response:
    found = builds.by_id.get(build)
    if found is None or found.template != template_id or found.status != "waiting" or \
            not secrets.compare_digest(found.secret, secret) or not _HASH.fullmatch(files_hash):
        raise NotFoundError("no such upload")
    builds.files.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = builds.folder(found.owner)
    folder.mkdir(exist_ok=True, mode=0o700)
    kept = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    if kept > MAX_KEPT:  # a key's uploads stay for its next builds: bounded in all
        for old in sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime):
            kept -= old.stat().st_size
            old.unlink(missing_ok=True)
            if kept <= MAX_KEPT // 2:
                break
    tmp = folder / f".{files_hash}.{secrets.token_hex(4)}"
    size = 0
    try:
        with open(tmp, "wb") as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_UPLOAD:
                    raise ResourceExhaustedError(f"a copy's files are over {MAX_UPLOAD >> 20} "
                                                 "MiB")
                out.write(chunk)
        os.replace(tmp, folder / f"{files_hash}.tar")
    finally:
        tmp.unlink(missing_ok=True)
    return Response(status_code=200)


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
def start_build(template_id: str, build_id: str, body: BuildStart, state: State,
                who: Caller, builds: BuildsDep, request: Request) -> Response:
    build = builds.get(who, template_id, build_id)
    if build.status != "waiting":
        raise InvalidArgumentError(f"build {build_id} was started already")
    check_build_network(state, who)
    tags: Tags = request.app.state.template_tags
    recipe, hashes = to_recipe(body, state, who, tags)
    auth = registry_auth(body.from_image_registry)
    folder = builds.folder(who.owner)
    tars, total = [], 0
    for files_hash in dict.fromkeys(hashes):
        path = folder / f"{files_hash}.tar"
        if not path.is_file():
            raise InvalidArgumentError(f"the files of hash {files_hash} were not uploaded")
        total += path.stat().st_size
        if total > MAX_UPLOAD:
            raise ResourceExhaustedError(f"the copies' files are over {MAX_UPLOAD >> 20} MiB "
                                         "in all")
        tars.append(path.read_bytes())
    build.status = "building"
    threading.Thread(target=_run, args=(state, build, recipe, tars, bool(body.force), auth,
                                        tags),
                     name="abx-e2b-build", daemon=True).start()
    return Response(status_code=202)


def _run(state: GatewayState, build: Build, recipe: str, tars: list[bytes],
         force: bool, auth: tuple[str, str] | None, tags: Tags) -> None:
    def log(message: str, level: str = "info") -> None:
        if len(build.logs) >= MAX_LOG_KEPT and level != "error":
            return  # a RUN printing without end must not fill the gateway's memory
        build.logs.append({"timestamp": e2b_time(time.time()), "level": level,
                           "message": message[:MAX_LOG_LINE]})

    def event(e: dict[str, Any]) -> None:
        if e["type"] == "step":
            cached = " (cached)" if e["cached"] else ""
            log(f"[{e['step']}/{e['of']}] {e['instruction']}{cached}")
        elif e["type"] == "log":
            for line in str(e["data"]).splitlines():
                log(line)
        elif e["type"] == "done":
            log(f"Build finished in {e['seconds']:.1f} s")

    try:
        extra = {"registry_auth": auth} if auth else {}
        info = state.provider.build_recipe(  # type: ignore[attr-defined]
            build.template, recipe, context_tar=tars, on_event=event, owner=build.owner,
            force=force, **extra)
        tags.change(info, build.tags, build_id=build.build_id, new_build=True)
        build.status = "ready"
    except SandboxError as exc:
        build.reason = exc.message
        log(exc.message, "error")
        build.status = "error"
    except Exception as exc:  # noqa: BLE001 - the client polls for it
        build.reason = f"internal error: {type(exc).__name__}"
        log(build.reason, "error")
        build.status = "error"


@router.get("/templates/{template_id}/builds/{build_id}/status")
def build_status(template_id: str, build_id: str, who: Caller, builds: BuildsDep,
                 logs_offset: Annotated[int, Query(alias="logsOffset", ge=0)] = 0
                 ) -> dict[str, Any]:
    build = builds.get(who, template_id, build_id)
    status = build.status
    entries = build.logs[logs_offset:logs_offset + MAX_LOG_ENTRIES]
    out: dict[str, Any] = {"templateID": template_id, "buildID": build_id,
                           "status": status, "logEntries": entries,
                           "logs": [e["message"] for e in entries]}
    if status == "error":
        out["reason"] = {"message": build.reason}
    return out


def to_recipe(body: BuildStart, state: GatewayState, who: Principal, tags: Tags
              ) -> tuple[str, list[str]]:
    """E2B's template as a recipe, and the hashes of the files its copies need."""
    if body.from_template:
        parent = tags.resolve(state, who, body.from_template)
    elif body.from_image:
        image = body.from_image
        parent = _E2B_IMAGES.get(image.split(":")[0], image)
    else:
        parent = BASE
    lines = [f"FROM {parent}"]
    hashes: list[str] = []
    user = ""
    for n, step in enumerate(body.steps, 1):
        args = step.args
        kind = step.type.upper()
        if kind == "RUN" and args:
            as_user = args[1] if len(args) > 1 and args[1] else ""
            if as_user and as_user != user:
                lines.append(f"USER {as_user}")
            lines.append("RUN " + json.dumps(["/bin/sh", "-c", args[0]]))
            if as_user and as_user != user:
                lines.append(f"USER {user or 'root'}")
        elif kind == "COPY" and len(args) >= 2:
            if not step.files_hash or not _HASH.fullmatch(step.files_hash):
                raise InvalidArgumentError(f"step {n}: a copy needs its filesHash")
            hashes.append(step.files_hash)
            flags = [f"--chown={args[2]}"] if len(args) > 2 and args[2] else []
            if len(args) > 3 and args[3]:
                flags.append(f"--chmod={args[3]}")
            lines.append(" ".join(["COPY", *flags, json.dumps(args[:2])]))
        elif kind == "ENV" and len(args) % 2 == 0:
            lines.append("ENV " + " ".join(f"{k}={shlex.quote(v)}"
                                           for k, v in zip(args[::2], args[1::2], strict=True)))
        elif kind == "WORKDIR" and len(args) == 1:
            lines.append(f"WORKDIR {args[0]}")
        elif kind == "USER" and len(args) == 1:
            user = args[0]
            lines.append(f"USER {user}")
        else:
            raise InvalidArgumentError(f"step {n}: {step.type} with {len(args)} argument(s) "
                                       "is not supported (RUN, COPY, ENV, WORKDIR, USER are)")
    if body.start_cmd:
        lines.append("CMD " + json.dumps(["/bin/sh", "-c", body.start_cmd]))
    if body.ready_cmd:
        lines.append("HEALTHCHECK CMD " + json.dumps(["/bin/sh", "-c", body.ready_cmd]))
    return "\n".join(lines) + "\n", hashes


def registry_auth(config: dict[str, Any] | None) -> tuple[str, str] | None:
    """E2B's ``fromImageRegistry`` as (user, password): the ``registry`` kind (``from_image``
    with credentials) is; AWS's and GCP's (cloud IAM exchanges) are refused."""
    if not config:
        return None
    kind = config.get("type")
    if kind == "registry":
        user, password = config.get("username"), config.get("password")
        if not (isinstance(user, str) and user and isinstance(password, str) and password) \
                or len(user) + len(password) > 4096:
            raise InvalidArgumentError("fromImageRegistry of type registry needs a username "
                                       "and a password")
        return user, password
    raise InvalidArgumentError(f"fromImageRegistry of type {str(kind)[:40]!r} is not supported "
                               "by this gateway (its cloud credential exchange is not "
                               "implemented): use from_image with a username and password, "
                               "or a template")


# ---- templates and aliases ---------------------------------------------------------------
@router.get("/templates")
def list_templates(state: State, who: Caller) -> list[dict[str, Any]]:
    return [_e2b_template(t) for t in visible(state, who)]


@router.get("/templates/aliases/{alias}")
def alias(alias: str, state: State, who: Caller) -> dict[str, Any]:
    for info in state.provider.list_templates():
        if info.name == alias:
            if who.admin or info.owner in ("", who.owner):
                return {"templateID": info.name, "public": not info.owner}
            raise PermissionDeniedError(f"template {alias!r} belongs to another tenant")
    raise NotFoundError(f"template {alias!r} not found")


@router.get("/templates/{template_id}")
def get_template(template_id: str, state: State, who: Caller) -> dict[str, Any]:
    info = template(state, who, template_id)
    return {**_e2b_template(info), "builds": [
        {"buildID": info.name, "status": "ready", "createdAt": e2b_time(info.created_at),
         "updatedAt": e2b_time(info.created_at), "cpuCount": 1, "memoryMB": 1024}]}


# DELETE /templates/{id} is control.py's: a snapshot's id deletes the snapshot, else this.
def delete_template(template_id: str, state: State, who: Caller) -> Response:
    info = template(state, who, template_id)
    if info.owner != who.owner or (not info.owner and not who.admin):
        raise PermissionDeniedError(f"template {template_id!r} is not yours to delete")
    state.provider.remove_template(template_id)
    return Response(status_code=204)
