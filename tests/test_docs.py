"""Every code block of the README and docs/*.md runs as written (or is checked against what
it shows), so that a reader who copies one gets what the page says.

How each kind of block is checked:
- ```python: run as a script (tests/docrun.py) in the page's scratch directory against the
  embedded engine; it must exit 0 and print what BLOCKS expects (its `# 0 42` comments).
- ```sh / ```bash: each command (a line; a trailing backslash or an open quote continues it)
  runs in order through bash in the page's scratch directory and HOME, and must exit 0
  unless COMMANDS says otherwise. There a server started in the foreground (`abx serve`)
  runs until it answers and is stopped with Ctrl-C (SIGINT) when the page is done, and an
  interactive one (`abx sandbox shell`) gets a terminal and keys. Placeholders a reader
  fills in are filled in: SBX (a sandbox of the page's own), VOL (its volume), $KEY and
  $SBX, e2b_... (the key the page made), <the session id from step 1>, gateway.example (a
  gateway the test runs). `sudo` runs its command as is: the test is root, and keeps the
  environment that points at its data dir.
- ```js: run with node beside E2B's JS SDK (the versions of tests/e2b/js/package.json).
- ```ini, ```text (excerpts and sample output): compared with what produces them (the
  daemon's unit, the gateway's NDJSON lines, the watch stream's SSE data); ```json,
  ```yaml, ```toml at least parse.
- a fence without a language, or in a language with no rule here, fails the test.
What cannot run here (systemd, Docker, a registry, Kubernetes objects the test cluster
cannot hold) is listed in COMMANDS / BLOCKS as a Skip with its reason, and reported as one
skipped test each (test_not_run); a block that cannot run for want of something this host
may lack (code-interpreter-v1, node, the test cluster) is skipped saying which.

The pages run once, side by side in LANES (a page at a time in each), when the first test
needs them; each test then says how its block went. The world the examples see: the
embedded engine on a data dir of this module's own, and no internet: pypi.org and
files.pythonhosted.org resolve, for sandboxes, to the stand-in index of tests/netprobe.py
on the host's loopback (ABX_NETWORK_HOSTS), and pip in the sandboxes of the examples is
pointed at it (PIP_INDEX_URL, PIP_TRUSTED_HOST in their environment), so
`network="registries"` is decided by the sandbox's policy proxy exactly as for PyPI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docpage
import pytest
import yaml
from docblocks import DOCS, SHELL, Block, blocks, commands
from docpage import Page, Run, Server, Skip, Tty, World

Hook = Callable[[Page], dict[str, str]]  # placeholders ("$NAME": an env var) for a block


@dataclass(frozen=True)
class Py:
    out: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    fetched: tuple[str, ...] = ()  # wheels pip must have taken from the stand-in index
    files: tuple[str, ...] = ()  # what it must leave in the scratch directory


@dataclass(frozen=True)
class Node:
    out: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """Held against what produces it: ``fn(page, block)`` asserts."""
    fn: Callable[[Page, Block], None]


@dataclass(frozen=True)
class Shell:
    before: Hook


Command = Run | Server | Tty | Skip
Handler = Py | Node | Check | Shell | Skip

INIT = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'
LIST = '{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}\n'
NOT_HERE_K8S = ("the test cluster has no registry and no kube-proxy, so the gateway cannot "
                "run in it as a Pod; tests/kubernetes/test_k8s_deploy_gateway.py runs it as "
                "the artifact does, as a host process, and tests/kubernetes/"
                "test_k8s_deploy_rbac.py applies these manifests with --dry-run=server")
EXAMPLE_REGISTRY = ("pushes to registry.example.com, an example registry (the tests reach "
                    "no registry)")


def _e2b_key(page: Page, out: str) -> None:
    page.subs["e2b_..."] = out.strip()


def _admin_key(page: Page, out: str) -> None:
    page.env["KEY"] = json.loads(out)["token"]


def _mcp_session(page: Page, out: str) -> None:
    found = re.search(r"(?im)^mcp-session-id:\s*(\S+)", out)
    assert found, f"no Mcp-Session-Id header in: {out[:500]}"
    page.subs["<the session id from step 1>"] = found.group(1)


# Commands of ```sh blocks run other than "run it, exit 0": (page, regex on the command).
COMMANDS: dict[tuple[str, str], Command] = {
    ("README.md", r"setup\.sh mcp"): Run(stdin=INIT + LIST, cwd="repo", needs=("setup", "code"),
                                          out=(r'"id":\s*1', r'"id":\s*2')),
    ("README.md", r"setup\.sh test"): Skip(
        "runs this whole suite (this test included) and starts the Kubernetes test cluster: "
        "it is how the suite is run, not something to run inside it"),
    ("docs/cli.md", r"^abx mcp start +#"): Run(stdin=INIT, out=(r'"id":\s*1',)),
    ("docs/cli.md", r"--http --background"): Run(out=(r"http://127\.0\.0\.1:9000/mcp",),
                                                  port=9000),
    ("docs/cli.md", r"--host 0\.0\.0\.0 --generate-token"): Server(
        health="http://127.0.0.1:9000/health", port=9000),
    ("docs/cli.md", r"abx mcp deploy --target fc"): Run(out=(r"bootstrap",)),
    ("docs/cli.md", r"SBX pip install"): Run(out=(r"Successfully installed rich",)),
    ("docs/cli.md", r"^abx sandbox shell SBX"): Tty(keys=((r"[#$] $", "exit\n"),)),
    ("docs/cli.md", r"run-code SBX 'print"): Run(out=(r"^2$",), needs=("code",),
                                                 sbx="code-interpreter-v1"),
    ("docs/cli.md", r"run-code SBX -l bash"): Run(out=(r"^42$",), needs=("code",),
                                                  sbx="code-interpreter-v1"),
    ("docs/cli.md", r"run-code SBX --save-dir"): Run(out=(r"as plots/image-1\.png$",),
                                                     needs=("code",), sbx="code-interpreter-v1"),
    ("docs/snapshots.md", r"abx sandbox snapshot SBX"): Run(out=(r"^snap-",), needs=("criu",)),
    ("docs/snapshots.md", r"abx snapshot list"): Run(out=(r"before-upgrade",),
                                                     needs=("criu",)),
    ("docs/cli.md", r"template build mytools"): Run(needs=("busybox",)),
    ("docs/cli.md", r"template remove mytools"): Run(needs=("busybox",)),
    ("docs/cli.md", r"template build code-interpreter-v1"): Run(needs=("code",)),
    ("docs/daemon.md", r"daemon (install|uninstall)|usermod"): Skip(
        "changes this host: a systemd unit in /etc/systemd/system, the group abx, a user's "
        "groups (tests/cli/test_serve_keys.py runs install and uninstall with a unit dir of "
        "its own, tests/server/test_daemon.py the daemon itself for real users)"),
    ("docs/daemon.md", r"# as alice"): Skip(
        "as alice, a member of group abx, once the daemon is installed (the lines around "
        "it); tests/server/test_daemon.py does this as real users"),
    ("docs/daemon.md", r"serve --unix /run/abx/abx\.sock"): Skip(
        "serves /run/abx/abx.sock, the socket every ordinary user's abx on this host would "
        "then pick as its engine; tests/server/test_daemon.py runs `abx serve --unix` on a "
        "socket of its own"),
    ("docs/e2b.md", r"keys create --name agents --e2b"): Run(capture=_e2b_key),
    ("docs/e2b.md", r"^abx serve"): Server(health="http://127.0.0.1:8080/health", port=8080),
    ("docs/e2b.md", r"e2b.suites"): Skip(
        "runs E2B's own suites (over 15 minutes on 2 cores, their own sandboxes) with "
        "pytest-asyncio, which the test extra leaves out: how they are run, not part of "
        "this suite; tests/unit/test_e2b_suites_script.py checks the runner's report"),
    ("docs/gateway.md", r"--name ops --admin --json"): Run(capture=_admin_key),
    ("docs/gateway.md", r"^abx serve"): Server(health="http://127.0.0.1:8080/health",
                                               port=8080),
    ("docs/gateway.md", r"/sandboxes/\$SBX/code"): Run(out=(r'"stdout": "1\\n"', r'"execution"')),
    ("docs/kubernetes-deploy.md", r"^abx mcp deploy"): Run(out=(r"kubectl apply",)),
    ("docs/kubernetes-deploy.md", r"^docker build"): Skip(
        "no Docker daemon here, and " + EXAMPLE_REGISTRY),
    ("docs/kubernetes-deploy.md", r"template push base"): Skip(
        "writes the template catalog of namespace agent-sandbox, which exists once the "
        "manifests are applied (below)"),
    ("docs/kubernetes-deploy.md", r"^skopeo"): Skip(EXAMPLE_REGISTRY),
    ("docs/kubernetes-deploy.md", r"^kubectl|abx sandbox create$"): Skip(NOT_HERE_K8S),
    ("docs/kubernetes-lab.md", r"k8s_cluster\.sh build"): Skip(
        "compiles Kubernetes where its cache is missing (about 18 minutes on 2 cores); "
        "scripts/setup.sh test runs it before the suite"),
    ("docs/kubernetes-lab.md", r"k8s_cluster\.sh up"): Run(needs=("cluster",), cwd="repo"),
    ("docs/kubernetes-lab.md", r"k8s_cluster\.sh status"): Run(rc=(0, 1, 3), cwd="repo"),
    ("docs/kubernetes-lab.md", r"k8s_cluster\.sh down"): Skip(
        "stops the cluster the Kubernetes tests of this run use"),
    ("docs/kubernetes-lab.md", r"k8s_cluster\.sh load"): Skip(
        "X.tar stands for image archives; `abx template push --load-lab` runs this for "
        "each Kubernetes test session (tests/k8scluster.py)"),
    ("docs/kubernetes.md", r"^pip install"): Skip(
        "installs from the package index, which the tests do not reach; the test "
        "environment has the extra (scripts/setup.sh installs .[test])"),
    ("docs/kubernetes.md", r"template push (base|mytools) --image"): Skip(
        "records the image in the template catalog of a cluster namespace (`sandboxes`, "
        "none on the test cluster) and writes a 150-500 MB archive; tests/k8scluster.py "
        "pushes base the same way, with --load-lab, for the Kubernetes tests"),
    ("docs/kubernetes.md", r"^skopeo"): Skip(EXAMPLE_REGISTRY),
    ("docs/kubernetes.md", r"--load-lab"): Skip(
        "imports base into every node of the test cluster (5-40 s): tests/k8scluster.py "
        "runs exactly this at the start of each Kubernetes test session"),
    ("docs/kubernetes.md", r"^abx serve"): Skip(
        "serves the sandboxes of namespace `sandboxes` of a cluster with base pushed into "
        "it (the lines above); the tests of tests/kubernetes run the gateway so on the "
        "test cluster"),
    ("docs/mcp.md", r"^printf"): Run(out=(r'^\{"jsonrpc":"2.0","id":1,',
                                          r'\n\{"jsonrpc":"2.0","id":2,')),
    ("docs/mcp.md", r"^curl -si"): Run(out=(r"mcp-session-id",), capture=_mcp_session),
    ("docs/mcp.md", r'"method":"tools/call"'): Run(out=(r'"isError":false', r"2"),
                                                   needs=("code",)),
    ("docs/network.md", r"abx sandbox info SBX"): Run(out=(r"allowlist",)),
    ("docs/ports.md", r"abx sandbox port SBX 8000"): Server(
        ready=r"port 8000: http://127\.0\.0\.1:\d+"),
    ("docs/ports.md", r"gateway\.example"): Run(out=(r"served from the sandbox",)),
    ("docs/terminals.md", r"shell SBX +#"): Tty(keys=((r"[#$] $", "echo $PWD\n"),
                                                      (r"[#$] $", "exit\n")),
                                                out=(r"/workspace",)),
    ("docs/terminals.md", r"--cmd 'python3'"): Tty(keys=((r">>> $", "exit()\n"),)),
    ("docs/terminals.md", r"-e DEBUG=1"): Tty(keys=((r"[#$] $", "echo $DEBUG $PWD\n"),
                                                    (r"[#$] $", "exit\n")),
                                              out=(r"1 /tmp",)),
}


def _daemon_unit(page: Page, block: Block) -> None:
    """The excerpt is the unit `abx daemon install` writes (ExecStart's program aside)."""
    from agent_sandbox.surfaces.cli.daemon_cmd import unit_text

    def service(text: str) -> dict[str, str]:
        lines = text.split("[Service]", 1)[1].split("\n[", 1)[0].splitlines()
        pairs = [line.split("=", 1) for line in lines if "=" in line
                 and not line.startswith("#")]
        return {k: v.split(" serve ", 1)[-1] if k == "ExecStart" else v for k, v in pairs}

    shown, written = service(block.text), service(unit_text())
    assert shown.items() <= written.items(), (shown, written)


def _code_ndjson(page: Page, block: Block) -> None:
    """The sample lines are those the curl above printed (`...` elides fields)."""
    page.need("code")  # else the curl did not run
    got = [json.loads(line) for line in page.last_out.splitlines() if line.strip()]
    for line in block.text.splitlines():
        shown = json.loads(line.replace(", ...", ""))
        assert any(_within(shown, g) for g in got), (line, page.last_out)


def _within(shown: Any, got: Any) -> bool:
    if isinstance(shown, dict):
        return isinstance(got, dict) and all(k in got and _within(v, got[k])
                                             for k, v in shown.items())
    return shown == got


def _sse(page: Page, block: Block) -> None:
    """Server-Sent Events whose data is JSON, as the gateway sends them."""
    for line in block.text.splitlines():
        if line.startswith("data: "):
            json.loads(line[6:])
        else:
            assert line == "" or re.match(r"(event: \w+|: keepalive)$", line), line


def _gateway_code_sandbox(page: Page) -> dict[str, str]:
    """$SBX: a code-interpreter sandbox made through the page's gateway with $KEY."""
    page.need("code")
    made = docpage.post_json("http://127.0.0.1:8080/v1/sandboxes",
                             {"template": "code-interpreter-v1"}, page.env["KEY"])
    return {"$SBX": made["sandbox_id"]}


def _mcp_http_server(page: Page) -> dict[str, str]:
    """What the prose says to run first: the HTTP server with that token."""
    page.start_server("abx mcp start --http --port 9000",
                      Server(health="http://127.0.0.1:9000/health", port=9000,
                             env={"ABX_MCP_AUTH_TOKEN": "replace_me"}))
    return {}


def _gateway_port(page: Page) -> dict[str, str]:
    """A gateway with a key, and a sandbox of that key serving /index.html on port 8000."""
    url, key = page.world.gateway()
    sbx = page.world.sandbox(page.env, template="base", remote=(url, key),
                             files={"/workspace/index.html": "served from the sandbox\n"},
                             background=["python3 -m http.server 8000"])
    return {"https://gateway.example": url, "$KEY": key, "SBX": sbx["id"]}


def _layers(page: Page, block: Block) -> None:
    """The diagram of docs/architecture.md names the package's folders, each of which is
    there (the layers themselves are tests/test_package_structure.py's)."""
    package = Path(__file__).resolve().parent.parent / "agent_sandbox"
    named = set(re.findall(r"(?<![\w/])([a-z]+)/", block.text))
    assert named, "the diagram names no folder"
    missing = [name for name in named
               if not any(package.glob(f"**/{name}/__init__.py"))]
    assert not missing, f"{block.where} names folders the package lacks: {missing}"


def _request_bodies(page: Page, block: Block) -> None:
    """docs/gateway.md's request bodies: tests/server/test_docs_bodies.py sends each
    through the gateway's own request models."""
    assert re.search(r"^POST /v1/sandboxes ", block.text, re.M), block.where


# Blocks other than sh/bash, and sh blocks that need something first: (page, regex on
# the block's text). A ```python block with no entry just has to run.
BLOCKS: dict[tuple[str, str], Handler] = {
    ("README.md", r"memory_mb=512"): Py(
        out=(r"^0 42$", r"type='create'.*name='new'", r"^0$", r"^1$", r"^user$",
             r"^100001$", r"^124$"),
        fetched=("requests-1.0-py3-none-any.whl",), files=("out/data.csv",)),
    ("README.md", r'template="code-interpreter-v1"'): Py(out=(r"^42 None$",), needs=("code",)),
    ("docs/architecture.md", r"^surfaces/"): Check(_layers),
    ("docs/daemon.md", r"\[Service\]"): Check(_daemon_unit),
    ("docs/snapshots.md", r"sb\.snapshot\(name="): Py(out=(r"^step-1$", r"^True$"),
                                                       needs=("criu",)),
    ("docs/e2b.md", r"from e2b_code_interpreter"): Py(out=(r"^hi$", r"^42$", r"^2,4$"),
                                                          needs=("code", "node")),
    ("docs/e2b.md", r"@e2b/code-interpreter"): Node(out=(r"^hi$",), needs=("code", "node")),
    ("docs/e2b.md", r"reverse_proxy"): Skip(
        "a Caddy configuration: no Caddy here, and its wildcard certificate needs a DNS "
        "domain; the Host routing it forwards is tested by tests/e2b/test_e2b_tenancy.py"),
    ("docs/e2b.md", r"proxy_pass"): Skip(
        "an nginx configuration: no nginx here, and its wildcard certificate needs a DNS "
        "domain; the Host routing it forwards is tested by tests/e2b/test_e2b_tenancy.py"),
    ("docs/ports.md", r"share_port\(3000"): Skip(
        "calls on a sandbox of a gateway's provider (sb); the same calls run in a browser "
        "test, tests/server/test_previews_browser.py"),
    ("docs/ports.md", r"\*\.preview\.example\.com \{"): Skip(
        "a Caddy configuration: no Caddy here, and its wildcard certificate needs a DNS "
        "domain; the host routing it forwards is tested by tests/server/"
        "test_previews_browser.py"),
    ("docs/ports.md", r"server_name \*\.preview"): Skip(
        "an nginx configuration: no nginx here, and its wildcard certificate needs a DNS "
        "domain; the host routing it forwards is tested by tests/server/"
        "test_previews_browser.py"),
    ("docs/gateway.md", r"/v1/sandboxes/\$SBX/code"): Shell(before=_gateway_code_sandbox),
    ("docs/gateway.md", r'^\{"stdout"'): Check(_code_ndjson),
    ("docs/gateway.md", r"^POST /v1/sandboxes "): Check(_request_bodies),
    ("docs/mcp.md", r"curl -si http://localhost:9000/mcp"): Shell(before=_mcp_http_server),
    ("docs/network.md", r"flask"): Py(fetched=("flask-1.0-py3-none-any.whl",)),
    ("docs/ports.md", r"gateway\.example"): Shell(before=_gateway_port),
    ("docs/watch.md", r"event: ready"): Check(_sse),
    ("docs/watch.md", r"watch_dir"): Py(out=(r"^create out$", r"^create out/a\.txt$")),
}
# Data blocks with no entry in BLOCKS must at least parse.
PARSE: dict[str, Callable[[str], Any]] = {
    "json": json.loads, "yaml": yaml.safe_load, "toml": tomllib.loads}
LANGS = {*SHELL, *PARSE, "python", "js", "ini", "text", "http", "caddyfile", "nginx"}


def _handlers(block: Block) -> list[Handler]:
    return [h for (doc, rx), h in BLOCKS.items()
            if doc == block.doc and re.search(rx, block.text, re.M)]


def _handler(block: Block) -> Handler | None:
    found = _handlers(block)
    assert len(found) <= 1, f"{block.where}: {len(found)} entries of BLOCKS match"
    return found[0] if found else None


def _commands(doc: str, cmd: str) -> list[Command]:
    return [h for (d, rx), h in COMMANDS.items() if d == doc and re.search(rx, cmd, re.M)]


def _command(doc: str, cmd: str) -> Command:
    found = _commands(doc, cmd)
    assert len(found) <= 1, f"{doc}: {len(found)} entries of COMMANDS match {cmd!r}"
    return found[0] if found else Run()


ALL = [b for doc in DOCS for b in blocks(doc)]
# What test_block_runs_as_written runs, and what cannot run here (test_not_run); made
# without asserting: an ambiguous table fails test_every_block_has_a_way_to_be_checked,
# not the collection.
RUN = [b for b in ALL if not any(isinstance(h, Skip) for h in _handlers(b))]
NOT_RUN = [(f"{b.where} {b.lang}", h.reason) for b in ALL for h in _handlers(b)[:1]
           if isinstance(h, Skip)]
NOT_RUN += [(f"{b.where} {cmd.splitlines()[0].split('  #')[0].strip()[:60]}", h.reason)
            for b in RUN if b.lang in SHELL for cmd in commands(b.text)
            for h in _commands(b.doc, cmd)[:1] if isinstance(h, Skip)]


def test_every_block_has_a_way_to_be_checked() -> None:
    """No block in an unknown language, none without a language, no stale entry here."""
    assert ALL, "no code blocks found"
    bad = [f"{b.where}: language {b.lang or '(none)'!r}" for b in ALL if b.lang not in LANGS]
    bad += [f"{b.where}: a text block no entry of BLOCKS checks" for b in ALL
            if b.lang == "text" and _handler(b) is None]
    used_blocks = {key for key in BLOCKS for b in ALL
                   if key[0] == b.doc and re.search(key[1], b.text, re.M)}
    bad += [f"BLOCKS entry {key} matches no block" for key in BLOCKS if key not in used_blocks]
    cmds = [(b.doc, c) for b in ALL if b.lang in SHELL for c in commands(b.text)]
    bad += [f"COMMANDS entry {key} matches no command" for key in COMMANDS
            if not any(d == key[0] and re.search(key[1], c, re.M) for d, c in cmds)]
    for b in ALL:
        _handler(b)
    for doc, cmd in cmds:
        _command(doc, cmd)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("what,reason", NOT_RUN, ids=[w for w, _ in NOT_RUN])
def test_not_run(what: str, reason: str) -> None:
    """One skip per command or block that cannot run here, with the reason."""
    pytest.skip(reason)


def _new_page(page: Page) -> None:
    """What a page's examples take as given: the files they name, and what SBX holds."""
    if page.doc == "docs/cli.md":
        (page.dir / "data.csv").write_text("a,b\n1,2\n")
        (page.dir / "proj" / "src").mkdir(parents=True)
        (page.dir / "proj" / "src" / "main.py").write_text("print('hi')\n")
        if Path("/bin/busybox").is_file():  # a root filesystem: a shell and its applets
            (page.dir / "rootfs-dir" / "bin").mkdir(parents=True)
            shutil.copy("/bin/busybox", page.dir / "rootfs-dir" / "bin" / "busybox")
            (page.dir / "rootfs-dir" / "bin" / "sh").symlink_to("busybox")
        page.sbx_spec = {
            "template": "base",
            "files": {"/workspace/Makefile": "test:\n\t@echo all tests passed\n",
                      "/workspace/results/summary.txt": "ok\n"}}
    elif page.doc == "docs/ports.md":
        page.sbx_spec = {"template": "base", "background": ["python3 -m http.server 8000"]}


# The pages run side by side in these lanes, one page after another in each (a page that
# serves on a fixed port waits for another on the same to be done: World.port). The rest
# go last in the last lane.
LANES = [["docs/cli.md"],
         ["README.md", "docs/e2b.md", "docs/gateway.md"],
         ["docs/mcp.md", "docs/ports.md", "docs/network.md", "docs/terminals.md",
          "docs/watch.md"]]


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    """Every selected example, run once: the tests then say how each went."""
    pages = {item.callspec.params["block"].doc for item in request.session.items
             if item.originalname == "test_block_runs_as_written"}  # whole pages: the
    lanes = [[b for b in RUN if b.doc in docs and b.doc in pages] for docs in LANES]  # reader's
    lanes[-1] += [b for b in RUN if b.doc in pages  # way through a page
                  and not any(b.doc in docs for docs in LANES)]
    with World.open(request, tmp_path_factory.mktemp("docs"), _new_page) as w:
        w.run(lanes, run_block)
        yield w




@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_block_runs_as_written(block: Block, world: World) -> None:
    outcome = world.outcome(block)
    if outcome is not None:
        raise outcome


def run_block(page: Page, block: Block) -> None:
    """Run (or check) one block; a need the host lacks skips it, once the rest has run."""
    handler = _handler(block)
    if isinstance(handler, Skip):
        pytest.skip(handler.reason)
    lacking: list[str] = []
    if block.lang in SHELL:
        runnable = [(cmd, c) for cmd in commands(block.text)
                    if not isinstance(c := _command(block.doc, cmd), Skip)]
        if not runnable:
            pytest.skip("none of its commands can run here (test_not_run says why)")
        extra = handler.before(page) if isinstance(handler, Shell) else {}
        for cmd, command in runnable:
            missing = page.lacks(command.needs)
            if missing:
                lacking.append(f"`{cmd.splitlines()[0]}`: {missing}")
                continue
            page.command(cmd, command, extra)
    elif block.lang == "python":
        _python(page, block, handler if isinstance(handler, Py) else Py())
    elif isinstance(handler, Node):
        _node(page, block, handler)
    elif isinstance(handler, Check):
        handler.fn(page, block)
    elif block.lang in PARSE:
        PARSE[block.lang](block.text)
    else:
        raise AssertionError(f"{block.where}: nothing checks this {block.lang} block")
    if lacking:
        pytest.skip("not run: " + "; ".join(lacking))


def _python(page: Page, block: Block, spec: Py) -> None:
    page.need(*spec.needs)
    script = page.dir / f"example_{block.line}.py"
    script.write_text(block.text)
    before = len(page.world.fetched)
    env = {**page.env, "ABX_DOCS_PIP_INDEX": page.world.pip_index}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "docrun.py"),
                           str(script)], cwd=page.cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
    docpage.expect_in_order(done.stdout, spec.out, block.where)
    fetched = " ".join(page.world.fetched[before:])
    for wheel in spec.fetched:
        assert wheel in fetched, f"pip never took {wheel} from the stand-in index: {fetched}"
    for name in spec.files:
        assert (page.cwd / name).is_file(), f"{block.where} left no ./{name}"


def _node(page: Page, block: Block, spec: Node) -> None:
    page.need(*spec.needs)
    where = page.world.node_dir()
    script = where / f"docs_example_{block.line}.mjs"  # ESM finds packages beside it
    script.write_text(block.text)
    done = subprocess.run(["node", str(script)], cwd=page.cwd, env=page.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
    docpage.expect_in_order(done.stdout, spec.out, block.where)


