"""Data shapes shared by the providers and the SDK (and, later, the wire layers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.file_metadata import check as check_file_metadata
from agent_sandbox.core.network import NetworkPolicy


class SandboxInfo(BaseModel):
    sandbox_id: str
    template: str
    state: str
    created_at: float
    last_used: float
    timeout: float = Field(description="idle seconds before the sandbox is auto-paused")
    persistent: bool
    network: NetworkPolicy
    volume_id: str
    metadata: dict[str, str] = {}
    envs: dict[str, str] = {}
    limits: dict[str, Any] = {}
    # Which limits the host really enforces (e.g. {"memory": True, "disk": True}).
    enforced: dict[str, bool] = {}
    owner: str = Field("", description="the API key (tenant) that made it; empty locally")
    lifetime: float | None = Field(None, description="seconds from its start to its end")
    on_timeout: str = Field("pause", description="what its idle timeout does: pause or kill")
    keep_volume: bool = Field(True, description="an end it comes to by itself keeps /workspace")

    @property
    def expires_at(self) -> float:
        return self.last_used + self.timeout

    @property
    def ends_at(self) -> float | None:
        """When its lifetime ends it (None: no lifetime)."""
        return None if self.lifetime is None else self.created_at + self.lifetime


# A foreground command killed because it ran past its timeout exits with this code (as
# coreutils timeout(1)), with ``timed_out`` set; ``abx sandbox exec`` exits with it too.
TIMEOUT_EXIT_CODE = 124


class CommandResult(BaseModel):
    exit_code: int = Field(description="the command's exit status; 128+N when a signal N "
                           f"ended it; {TIMEOUT_EXIT_CODE} when it was killed at its timeout")
    stdout: str
    stderr: str
    truncated: bool = False
    timed_out: bool = False
    pid: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ProcessInfo(BaseModel):
    pid: int
    cmd: str
    running: bool
    exit_code: int | None = None
    started_at: float = 0.0


class SandboxLogEntry(BaseModel):
    """A line of a sandbox's log (``Sandbox.get_logs``, E2B's sandbox logs): what happened
    to it (``lifecycle``: created, paused, resumed, its timeout or network changed) and
    what its template's start command printed (``start``)."""

    timestamp: float  # Unix seconds
    level: Literal["debug", "info", "warn", "error"] = "info"
    message: str = Field(max_length=4096)
    source: Literal["lifecycle", "start"] = "lifecycle"


class ProcessOutput(BaseModel):
    pid: int
    stdout: str
    stderr: str
    running: bool
    exit_code: int | None = None
    truncated: bool = False


class EntryInfo(BaseModel):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    symlink_target: str | None = None
    owner: str = Field("", max_length=64, description="its owner's name in the sandbox "
                       "(its uid when the sandbox's /etc/passwd has none)")
    group: str = Field("", max_length=64, description="its group's name, likewise")
    # A regular file's version (write_file's if_match); None for anything else.
    version: str | None = None
    # A symlink's: the absolute path it finally resolves to and that entry's type (None:
    # it dangles, or loops).
    resolved_target: str | None = None
    target_type: Literal["file", "dir", "other"] | None = None
    metadata: dict[str, str] | None = Field(
        None, description="user-defined metadata (its user.e2b.* xattrs, E2B's file "
        "metadata), None when it has none")

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        try:  # a guest's report: within what a write could have set
            return check_file_metadata(value)
        except InvalidArgumentError as exc:
            raise ValueError(exc.message) from None


class FileLock(BaseModel):
    """An explicit lock on a file (``lock_file``): writes without its ``token`` get
    ``locked`` until it is released (``unlock_file``), its ``ttl`` runs out, or its holder's
    session ends."""

    path: str
    token: str
    holder: str
    expires_in: float


class FileChunks(Iterator[bytes]):
    """A file read in chunks, with the ``version`` it was read at (None: not known)."""

    def __init__(self, chunks: Iterator[bytes], version: str | None) -> None:
        self._chunks = chunks
        self.version = version

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class DirTransfer(BaseModel):
    """What ``files.upload_dir`` or ``files.download_dir`` copied, and what it left out."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    size: int = Field(0, description="bytes of file data written")
    skipped: list[str] = Field([], description="entries left out, each with the reason "
                               "(absolute or '..' names, through a symlink, sockets...)")


class TemplateInfo(BaseModel):
    name: str
    kind: str
    description: str = ""
    env: dict[str, str] = {}
    workdir: str = "/workspace"
    commands: dict[str, dict[str, str]] = {}
    has_kernel: bool = False
    languages: list[str] = Field([], description="the code interpreter's languages (each a "
                                 "kernel the template has)")
    created_at: float = 0.0
    # Recipe templates: the template built on, its own layers and their bytes, and the
    # API key (tenant) that built it ("" for the host's own, which every key may use).
    parent: str = ""
    layers: int = 0
    size_bytes: int = 0
    owner: str = ""


class VolumeInfo(BaseModel):
    volume_id: str
    size_mb: int = Field(description="its disk limit")
    created_at: float
    attached_to: str = Field("", description="the sandbox using it; empty: kept, unused")
    owner: str = Field("", description="the API key (tenant) whose sandbox made it (a "
                                       "gateway says; empty locally)")


class SnapshotInfo(BaseModel):
    """A sandbox's memory and files at one moment: any number of sandboxes start from it
    (``create(snapshot=...)``)."""

    snapshot_id: str
    name: str = Field("", description="your label for it (not unique)")
    sandbox_id: str = Field(description="the sandbox it was taken of (its parent)")
    template: str
    created_at: float
    size_bytes: int = Field(description="host disk it takes: memory image and files")
    owner: str = Field("", description="the API key (tenant) that took it; empty locally")


WATCH_EVENT_TYPES = ("create", "modify", "chmod", "delete", "rename", "overflow")


class FilesystemEvent(BaseModel):
    """One change in a watched directory (``files.watch_dir``)."""

    type: Literal["create", "modify", "chmod", "delete", "rename", "overflow"] = Field(
        description="what happened; `overflow`: events were lost (`dropped` says how many "
                    "when known, `message` why)")
    path: str = Field("", description="absolute path in the sandbox (a rename's new one)")
    name: str = Field("", description="`path` relative to the watched directory")
    old_path: str | None = Field(None, description="a rename's old path")
    is_dir: bool = False
    dropped: int | None = Field(None, description="overflow: events lost, if known")
    message: str = ""


# ---- the code interpreter -------------------------------------------------------------------

# The formats a Python kernel adds as E2B's code interpreter does (service/code/formatters.py):
# a pandas DataFrame's columns, and the data of a matplotlib figure's chart.
DATA_MIME = "e2b/data"
CHART_MIME = "e2b/chart"

# MIME type -> Result attribute.
RESULT_MIME_FIELDS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf",
    "text/latex": "latex", "application/json": "json", "application/javascript": "javascript",
    DATA_MIME: "data", CHART_MIME: "chart",
}


class Result(BaseModel):
    """One display item of a cell (``display(...)``, a figure, or the last expression's
    value when ``is_main_result``), one attribute per format as in E2B. Binary formats
    (``png``, ``jpeg``, ``pdf``) are base64 text; ``json`` is the decoded value; ``data``
    is a pandas DataFrame's columns (each a list); ``chart`` is what E2B's chart extraction
    (the ``e2b_charts`` package) finds in a matplotlib figure: ``type`` (``line``,
    ``scatter``, ``bar``, ``pie``, ``box_and_whisker``, ``superchart``, ``unknown``),
    ``title``, ``elements`` and, for the planar ones, labels, units, scales and ticks. Both
    are JSON the sandbox made: bounded as all its output, checked to be objects, never
    interpreted here."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json_data: Any = Field(default=None, alias="json")
    javascript: str | None = None
    data: dict[str, Any] | None = None
    chart: dict[str, Any] | None = None
    # Formats with no attribute of their own, by MIME type.
    extra: dict[str, Any] = {}
    is_main_result: bool = False

    model_config = {"populate_by_name": True}

    @property
    def json(self) -> Any:  # type: ignore[override]
        return self.json_data

    @classmethod
    def from_bundle(cls, data: dict[str, Any], is_main_result: bool = False) -> Result:
        fields: dict[str, Any] = {"is_main_result": is_main_result, "extra": {}}
        for mime, value in data.items():
            name = RESULT_MIME_FIELDS.get(mime)
            if name is None:
                fields["extra"][mime] = value
            else:
                fields["json_data" if name == "json" else name] = value
        return cls(**fields)

    def formats(self) -> list[str]:
        """The formats this result has, e.g. ``["text", "png"]``."""
        out = [name for name in RESULT_MIME_FIELDS.values()
               if getattr(self, "json_data" if name == "json" else name) is not None]
        return out + list(self.extra)

    def __str__(self) -> str:
        return self.text or ""


class ExecutionError(BaseModel):
    name: str
    value: str
    traceback: str = ""


class Execution(BaseModel):
    """What a ``run_code`` cell produced: results, output streams, the error if any."""

    results: list[Result] = []
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    execution_count: int | None = None
    context_id: str = "default"
    # The context's kernel was found dead and started again (its variables were lost).
    kernel_restarted: bool = False
    # Output past the per-cell cap (or that no honest kernel sends) was dropped.
    truncated: bool = False

    @property
    def text(self) -> str | None:
        """The main result's text, like E2B's ``Execution.text``."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None

    @property
    def logs(self) -> dict[str, str]:
        return {"stdout": self.stdout, "stderr": self.stderr}


class CodeContext(BaseModel):
    """An independent interpreter (its own kernel and variables) inside a sandbox."""

    id: str
    language: str = "python"
    cwd: str = "/workspace"
    user: str | None = Field(None, description="the account of the sandbox its kernel runs "
                                               "as; null: root")
