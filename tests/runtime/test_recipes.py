"""Templates from recipes on real runc: a Dockerfile built step by step, each RUN in a
sandbox (pip against the stand-in package index), COPY from a confined context, cached by
content, failures and hostile steps handled."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netprobe import HTTP_NAME, internet

from agent_sandbox import Sandbox
from agent_sandbox.backends.runc.templates.store import sweep_leftovers
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    WrongStateError,
)
from agent_sandbox.providers.local import local_provider
from agent_sandbox.service.recipes import BUILD_META
from agent_sandbox.service.service import SandboxService

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def svc() -> SandboxService:
    return local_provider()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with internet(tmp_path_factory.mktemp("internet")) as servers:
        yield f"http://{HTTP_NAME}:{servers['http_port']}/simple/"


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = tmp_path_factory.mktemp("ctx")
    (ctx / "app").mkdir()
    (ctx / "app" / "main.py").write_text("print('main')\n")
    os.symlink("main.py", ctx / "app" / "inner-link")  # stays a link, inside the context
    (ctx / "notes.txt").write_text("notes\n")
    os.symlink("/etc", ctx / "escape")
    return ctx


def _recipe(index: str, last: str = "whoami > /tmp/who") -> str:
    """Steps: 1 FROM, 2 ENV, 3 WORKDIR, 4 COPY, 5 RUN (hostile), 6 RUN pip, 7 USER,
    8 RUN ``last``, 9 CMD, 10 HEALTHCHECK."""
    return f"""FROM base
ENV GREETING=hi
WORKDIR /opt/app
COPY --chown=user app/ ./
RUN echo five > five && echo "$GREETING" > greeting && chmod 4755 greeting \\
      && ln -s /etc/shadow shadowlink && ln greeting hardlink && (mknod dev c 1 3 || true)
RUN python3 -m pip install --break-system-packages --no-cache-dir --progress-bar off \\
      --index-url {index} --trusted-host {HTTP_NAME} abxdemo
USER user
RUN {last}
CMD ["sh", "-c", "echo started > /tmp/started; exec sleep 600"]
HEALTHCHECK CMD test -f /tmp/started
"""


def _build(svc: SandboxService, name: str, text: str, context: Path | None
           ) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    info = svc.build_recipe(name, text, context=str(context) if context else None,
                            on_event=events.append, network=[HTTP_NAME])
    return info, events


def _cached(events: list[dict[str, Any]]) -> list[bool]:
    return [e["cached"] for e in events if e["type"] == "step"]


@pytest.fixture(scope="module")
def built(svc: SandboxService, index: str, context: Path) -> list[dict[str, Any]]:
    name = "recipe-test"
    _info, events = _build(svc, name, _recipe(index), context)
    return events


def test_a_recipe_builds_a_template_that_runs(svc: SandboxService, built: list[dict[str, Any]]
                                              ) -> None:
    assert _cached(built) == [True, True, False, False, False, False, True, False, True, True]
    logs = "".join(e["data"] for e in built if e["type"] == "log" and e["step"] == 6)
    assert "Successfully installed abxdemo" in logs  # pip's output, streamed
    assert built[-1]["type"] == "done"
    info = next(t for t in svc.list_templates() if t.name == "recipe-test")
    assert info.kind == "recipe" and info.workdir == "/opt/app"
    with Sandbox.create(template="recipe-test") as sb:
        run = sb.commands.run
        assert run("pwd; whoami; echo $GREETING").stdout.split() == ["/opt/app", "user", "hi"]
        assert run("python3 -c 'import abxdemo; print(abxdemo.VALUE)'").stdout.strip() == "42"
        assert run("stat -c '%U %n' main.py").stdout.strip() == "user main.py"
        assert run("readlink inner-link").stdout.strip() == "main.py"
        assert run("cat five /tmp/who").stdout.split() == ["five", "user"]
        assert run("cat /tmp/started").stdout.strip() == "started"  # CMD, checked ready
        # The hostile step's results, as the layer diff kept them.
        assert run("stat -c '%a %U' greeting").stdout.strip() == "4755 root"
        assert run("readlink shadowlink").stdout.strip() == "/etc/shadow"
        assert run("stat -c %h greeting").stdout.strip() == "2"  # the hard link, kept
        assert run("test -e dev || echo none").stdout.strip() == "none"
    # The engine's own mount points (runc made them in the upper dir) are no part of it.
    layers = svc.backend.recipes().root
    assert not list(layers.glob("*/_/.abx")) and not list(layers.glob("*/_etc/ld.so.preload"))


def test_an_unchanged_recipe_is_all_cached_and_a_change_rebuilds_from_it(
        svc: SandboxService, index: str, context: Path, built: list[dict[str, Any]]) -> None:
    started = time.monotonic()
    _info, events = _build(svc, "recipe-test", _recipe(index), context)
    assert all(_cached(events)) and not [e for e in events if e["type"] == "log"]
    print(f"cached rebuild: {time.monotonic() - started:.3f} s")
    _info, events = _build(svc, "recipe-test-2", _recipe(index, "id -un > /tmp/who"), context)
    assert _cached(events) == [True] * 7 + [False, True, True]  # from the changed step on


def test_the_host_changing_under_base_keeps_the_cache(
        svc: SandboxService, index: str, context: Path, built: list[dict[str, Any]]) -> None:
    """Base is the host's OS as it is: a user added to its /etc (a new /etc snapshot)
    rebuilds nothing, and the template then runs on the new snapshot."""
    store = svc.backend.recipes().store
    before = store.ensure_base()
    marker = Path(f"/etc/abx-test-{os.getpid()}-{time.time_ns()}")
    marker.write_text("new\n")
    try:
        store.refresh_base()
        assert store.ensure_base().layers != before.layers  # a new /etc snapshot
        _info, events = _build(svc, "recipe-test", _recipe(index), context)
        assert all(_cached(events)), _cached(events)
        with Sandbox.create(template="recipe-test") as sb:
            assert sb.commands.run(f"cat {marker}").stdout == "new\n"
    finally:
        marker.unlink()
        store.refresh_base()


def test_a_failing_step_leaves_no_template_and_keeps_the_layers_before(
        svc: SandboxService, context: Path, built: list[dict[str, Any]]) -> None:
    text = "FROM base\nENV GREETING=hi\nWORKDIR /opt/app\nCOPY --chown=user app/ ./\n" \
           "RUN echo broken >&2; exit 3\n"
    with pytest.raises(InvalidArgumentError, match=r"recipe line 5 \(step 5\) failed with "
                                                   r"exit code 3.*\n.*broken"):
        _build(svc, "recipe-broken", text, context)
    with pytest.raises(NotFoundError):
        svc.backend.template("recipe-broken")
    events: list[dict[str, Any]] = []
    with pytest.raises(InvalidArgumentError):
        svc.build_recipe("recipe-broken", text, context=str(context), on_event=events.append)
    assert _cached(events) == [True] * 4 + [False]  # up to the failed step: cached
    assert not [s for s in svc.list() if s.metadata.get(BUILD_META)]  # its sandbox: gone


@pytest.mark.parametrize(("copy", "message"), [
    ("COPY ../x /opt/", "outside the build context"),
    ("COPY escape/passwd /opt/", "leads out of the build context"),
    ("COPY missing /opt/", "no such file"),
    ("COPY notes.txt /workspace/", "/workspace is each sandbox's own volume"),
])
def test_copy_stays_in_the_context(svc: SandboxService, context: Path, copy: str,
                                   message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        _build(svc, "recipe-copy", f"FROM base\n{copy}\n", context)


def test_a_copied_symlink_stays_a_link(svc: SandboxService, context: Path) -> None:
    """As Docker (and E2B's builder, whose tests copy a folder of links): a symlink a COPY
    names or matches is copied as the link it is, wherever it points; the host never
    follows it."""
    _build(svc, "recipe-links", "FROM base\nCOPY escape app/* /opt/links/\n", context)
    with Sandbox.create(template="recipe-links") as sb:
        out = sb.commands.run("readlink /opt/links/escape /opt/links/inner-link; "
                              "cat /opt/links/main.py").stdout
        assert out == "/etc\nmain.py\nprint('main')\n"


def test_copy_and_workdir_paths_are_normalised(svc: SandboxService, context: Path) -> None:
    _build(svc, "recipe-dots", "FROM base\nWORKDIR /../../opt/../opt/dots\n"
           "COPY notes.txt ../../../opt/dots/sub/\n", context)
    assert svc.backend.template("recipe-dots").workdir == "/opt/dots"
    root = svc.backend.recipes().root
    assert list(root.glob("*/_/opt/dots/sub/notes.txt"))


def test_a_huge_context_is_refused(svc: SandboxService, tmp_path: Path) -> None:
    with open(tmp_path / "huge", "wb") as fh:
        fh.truncate(10 << 30)  # 10 GiB, sparse
    limit = svc.config.build_max_layer_mb
    with pytest.raises(ResourceExhaustedError, match=f"over {limit} MiB"):
        _build(svc, "recipe-huge", "FROM base\nCOPY huge /opt/\n", tmp_path)


def test_one_build_of_a_name_at_a_time(svc: SandboxService, context: Path) -> None:
    with svc.backend.recipes().building("recipe-busy"), \
            pytest.raises(WrongStateError, match="being built by another build"):
        _build(svc, "recipe-busy", "FROM base\n", context)


def test_prune_removes_only_unreferenced_layers(svc: SandboxService, context: Path,
                                                built: list[dict[str, Any]]) -> None:
    _build(svc, "recipe-prune", "FROM base\nCOPY notes.txt /opt/pruned/\n", context)
    kept = svc.backend.template("recipe-test").build_inputs["recipe_layers"]
    svc.remove_template("recipe-prune")
    layers, _freed = svc.prune_layers()
    assert layers >= 1
    root = svc.backend.recipes().root
    assert all((root / key).is_dir() for key in kept)  # a template's layers stay
    assert not list(root.glob("*/_/opt/pruned"))


def test_a_build_killed_mid_step_leaves_nothing_after_the_next_start(
        svc: SandboxService, context: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "Dockerfile"
    recipe.write_text("FROM base\nRUN echo going; sleep 300\n")
    abx = Path(sys.executable).with_name("abx")
    proc = subprocess.Popen([str(abx), "template", "build", "recipe-killed", "--file",
                             str(recipe), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # its RUN is running
        if '"data": "going' in line:
            break
    proc.kill()  # SIGKILL: nothing of it runs its cleanup
    proc.wait()
    left = [s for s in svc.list() if s.metadata.get(BUILD_META) == str(proc.pid)]
    assert left, "the killed build's step sandbox should still be there"
    _build(svc, "recipe-after-kill", "FROM base\n", context)  # the next build
    assert not [s for s in svc.list() if s.metadata.get(BUILD_META) == str(proc.pid)]
    root = svc.backend.templates.root
    sweep_leftovers(root)  # what the store does when an engine starts
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp") and
                f"-{proc.pid}-" in p.name]
    with pytest.raises(NotFoundError):
        svc.backend.template("recipe-killed")
