"""What tests/test_docs.py runs the docs' examples in: a World (a data dir, the stand-in
internet, the environment every example gets) and a Page per doc (its scratch directory,
HOME, placeholders, sandbox and servers), and how a page runs one shell command."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import netprobe
import pytest
from docblocks import ROOT, Block
from ptyscreen import Screen

# Settings a developer's shell may carry that would change what the examples do.
SCRUB = re.compile(r"^(ABX_SANDBOX_|ABX_ENGINE$|ABX_DEFAULT_TEMPLATE$|ABX_MCP_|ABX_K8S_|"
                   r"SANDBOX_REGION$|E2B_|KUBECONFIG$|XDG_CONFIG_HOME$|CODEX_HOME$|APPDATA$|"
                   r"PIP_)")
STAND_IN = "pypi.org", "files.pythonhosted.org"  # names of the stand-in index, for sandboxes
BASH_OWN = {"PWD", "OLDPWD", "SHLVL", "_"}
NEEDS = ("code", "node", "cluster", "busybox", "setup")  # what this host may lack


@dataclass(frozen=True)
class Run:
    """Run it; it must exit with ``rc`` and print each of ``out`` (regexes, in order, on
    stdout then stderr)."""
    rc: int | tuple[int, ...] = 0
    out: tuple[str, ...] = ()
    stdin: str | None = None
    needs: tuple[str, ...] = ()
    capture: Callable[[Page, str], None] | None = None  # reads its stdout into the page
    cwd: str = ""  # "repo": the checkout (the README's commands run from a clone)
    sbx: str = ""  # the template SBX must be of, when not the page's
    port: int = 0  # a fixed port it serves on (no other page uses it meanwhile)


@dataclass(frozen=True)
class Server:
    """A server in the foreground: ready once ``health`` answers (or its output matches
    ``ready``), stopped with Ctrl-C (SIGINT) when the page is done."""
    health: str = ""
    ready: str = ""
    port: int = 0  # a fixed port it serves on (in use by another program: it cannot run)
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tty:
    """An interactive program on a terminal: for each (regex, keys), wait for the regex on
    the screen, then type the keys; it must exit with ``rc`` and show each of ``out``."""
    keys: tuple[tuple[str, str], ...]
    rc: int = 0
    out: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skip:
    reason: str


def expect_in_order(text: str, patterns: tuple[str, ...], where: str) -> None:
    pos = 0
    for pattern in patterns:
        found = re.compile(pattern, re.M).search(text, pos)
        assert found, f"{where}: {pattern!r} not in its output (after {pos}):\n{text[-3000:]}"
        pos = found.end()


def post_json(url: str, body: dict[str, Any], key: str) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as answer:
        return json.loads(answer.read())


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _answers(url: str) -> bool:
    """An HTTP answer, whatever its status (a server with a token set answers 401)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, urllib.error.URLError):
        return False


# Run in a process of its own on the World's data dir: kill what the examples left.
_CLEANUP = """
from agent_sandbox.providers.local import local_provider
from agent_sandbox.backends.runc import supervisor
engine = local_provider()
engine.drain_pool()
for info in engine.list():
    engine.kill(info.sandbox_id, delete_volume=True)
for volume in engine.list_volumes():
    engine.delete_volume(volume.volume_id)
supervisor.stop(engine.config.data_dir)
engine.close()
engine.backend.release_host_mounts()
"""
# A sandbox for a page's placeholders (arguments as JSON in argv[1]).
_SANDBOX = """
import json, sys
from agent_sandbox import Sandbox
a = json.loads(sys.argv[1])
sb = Sandbox.create(template=a["template"], network=a["network"], envs=a["envs"], timeout=900)
for path, text in a["files"].items():
    sb.files.write(path, text)
for cmd in a["background"]:
    sb.commands.run(cmd, background=True)
print(json.dumps({"id": sb.sandbox_id, "volume": sb.volume_id}))
"""


class World:
    """What every page shares: the engine's data dir (this module's own), the stand-in
    internet, the base environment, what this host offers (``need``), a gateway."""

    def __init__(self, request: pytest.FixtureRequest, tmp: Path, data: Path,
                 net: dict[str, Any], on_new_page: Callable[[Page], None]) -> None:
        self.request, self.tmp, self.data, self.net = request, tmp, data, net
        self.on_new_page = on_new_page
        self.pages: dict[str, Page] = {}
        self.outcomes: dict[str, BaseException | None] = {}
        self._lock = threading.Lock()
        self._ports: dict[int, threading.Lock] = {}
        self.problems: list[str] = []
        self._needs: dict[str, str | None] = {}
        self._node: Path | None = None
        self._gateway: tuple[str, str] | None = None
        self._stack = contextlib.ExitStack()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        sudo = bin_dir / "sudo"  # root already; the real sudo would drop ABX_DATA_DIR
        sudo.write_text('#!/bin/sh\nexec "$@"\n')
        sudo.chmod(0o755)
        hosts = netprobe.ENV["ABX_NETWORK_HOSTS"] + "".join(
            f",{name}={netprobe.HTTP_ADDR}" for name in STAND_IN)
        self.env = {k: v for k, v in os.environ.items() if not SCRUB.match(k)}
        self.env.update(
            ABX_DATA_DIR=str(data), ABX_POOL_SIZE="0", ABX_NETWORK_HOSTS=hosts,
            ABX_NETWORK_OPEN_RANGES=netprobe.ENV["ABX_NETWORK_OPEN_RANGES"],
            PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            COLUMNS="200", NO_COLOR="1", TERM="dumb")
        self.pip_index = f"http://{STAND_IN[0]}:{net['http_port']}/simple"

    @classmethod
    @contextlib.contextmanager
    def open(cls, request: pytest.FixtureRequest, tmp: Path,
             on_new_page: Callable[[Page], None]) -> Iterator[World]:
        tmp.chmod(0o755)
        data = Path(tempfile.mkdtemp(prefix="abx-docs-", dir="/var/tmp"))
        data.chmod(0o711)
        (tmp / "internet").mkdir()
        with netprobe.internet(tmp / "internet", packages=("requests", "flask", "rich")) as net:
            world = cls(request, tmp, data, net, on_new_page)
            try:
                yield world
            finally:
                world.close()
        assert not world.problems, "\n".join(world.problems)

    @property
    def fetched(self) -> list[str]:
        return self.net["fetched"]

    def run(self, lanes: list[list[Block]], run_block: Callable[[Page, Block], None]) -> None:
        """Each lane's blocks in order, a page at a time (its servers stopped before the
        next page); the lanes side by side. What each block did is in ``outcomes``."""
        for name in NEEDS:  # in this thread: they may use pytest's fixtures
            self.need(name)
        with ThreadPoolExecutor(len(lanes)) as pool:
            for done in [pool.submit(self._lane, lane, run_block) for lane in lanes]:
                done.result()

    def _lane(self, lane: list[Block], run_block: Callable[[Page, Block], None]) -> None:
        page: Page | None = None
        for block in lane:
            if page is None or page.doc != block.doc:
                if page is not None:
                    page.close()  # its servers hold ports the next page may use
                page = Page(self, block.doc)
                with self._lock:
                    self.pages[block.doc] = page
                self.on_new_page(page)
            page.run(block, run_block)
        if page is not None:
            page.close()

    def port(self, number: int) -> threading.Lock:
        """Held by the page that serves on fixed port ``number`` until the page is done."""
        with self._lock:
            return self._ports.setdefault(number, threading.Lock())

    def outcome(self, block: Block) -> BaseException | None:
        """How the block went: None (it ran as written) or what to raise."""
        if block.where not in self.outcomes:
            return AssertionError(f"{block.where} was not run (its page was not selected?)")
        return self.outcomes[block.where]

    def close(self) -> None:
        for page in self.pages.values():
            page.close()  # those a failed lane left open
        self._stack.close()
        env = {**os.environ, "ABX_DATA_DIR": str(self.data)}
        done = subprocess.run([sys.executable, "-c", _CLEANUP], env=env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            self.problems.append(f"cleaning up {self.data} failed: {done.stderr[-2000:]}")
        shutil.rmtree(self.data, ignore_errors=True)

    def need(self, name: str) -> str | None:
        """None when this host has ``name``; else why not."""
        if name not in self._needs:
            self._needs[name] = self._check(name)
        return self._needs[name]

    def _check(self, name: str) -> str | None:
        if name == "code":
            try:
                self.request.getfixturevalue("code_template")
            except pytest.skip.Exception as exc:
                return str(exc.msg)
            return None
        if name == "node":
            from npmcache import node_packages

            try:
                self._node = node_packages(ROOT / "tests" / "e2b" / "js")
            except pytest.skip.Exception as exc:
                return str(exc.msg)
            return None
        if name == "cluster":
            import k8scluster

            return k8scluster.missing()
        if name == "criu":
            from agent_sandbox.backends.runc import criu

            return criu.problem() or None
        if name == "busybox":
            return None if Path("/bin/busybox").is_file() else \
                "no /bin/busybox to make ./rootfs-dir from (apt-get install busybox-static)"
        if name == "setup":
            return _setup_would_change()
        raise AssertionError(f"unknown need {name!r}")

    def node_dir(self) -> Path:
        assert self._node is not None, "need('node') first"
        return self._node

    def gateway(self) -> tuple[str, str]:
        """A gateway (``abx serve``) on this data dir and one key's token."""
        with self._lock:
            if self._gateway is None:
                from gateways import running_gateway

                proc, _store, tokens = self._stack.enter_context(running_gateway(
                    "abx-docs-keys-", {"docs": {}}, env=self.env))
                self._gateway = proc.url, tokens["docs"]
            return self._gateway

    def sandbox(self, env: dict[str, str], template: str, remote: tuple[str, str] | None = None,
                files: dict[str, str] | None = None, background: list[str] | None = None
                ) -> dict[str, str]:
        """A sandbox (through ``remote``, a gateway's URL and key, if given): its id and
        volume. A local one may reach the stand-in index (pip pointed at it)."""
        args = {"template": template, "files": files or {}, "background": background or [],
                "network": "off" if remote else "registries",
                "envs": {} if remote else {"PIP_INDEX_URL": self.pip_index,
                                           "PIP_TRUSTED_HOST": STAND_IN[0]}}
        if remote:
            env = {**env, "ABX_SANDBOX_BASE_URL": remote[0], "ABX_SANDBOX_API_KEY": remote[1]}
        done = subprocess.run([sys.executable, "-c", _SANDBOX, json.dumps(args)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"a sandbox for the examples: {done.stderr[-2000:]}"
        return json.loads(done.stdout)


def _setup_would_change() -> str | None:
    """Why scripts/setup.sh would do more than check here (then the test does not run it:
    it would install packages or reach the package index), or None."""
    venv = ROOT / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve():
        return f"this suite runs from {sys.prefix}, not the checkout's .venv setup.sh uses"
    stamp = venv / ".installed"
    if not stamp.exists() or (ROOT / "pyproject.toml").stat().st_mtime > stamp.stat().st_mtime:
        return "setup.sh would reinstall the package (pyproject.toml is newer than .venv)"
    for pkg in ("runc", "e2fsprogs", "util-linux", "iproute2", "nftables", "python3",
                "python3-venv", "uidmap"):
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                              text=True)
        if "install ok installed" not in done.stdout:
            return f"setup.sh would install {pkg} with apt"
    return None


class Page:
    """One doc as a reader goes through it: a scratch directory that is also HOME, the
    environment its commands leave (export, cd), its placeholders, a sandbox of its own."""

    def __init__(self, world: World, doc: str) -> None:
        self.world, self.doc = world, doc
        self.dir = world.tmp / re.sub(r"\W", "_", doc)
        self.dir.mkdir()
        self.dir.chmod(0o755)
        self.cwd = self.dir
        self.env = {**world.env, "HOME": str(self.dir),
                    "ABX_GATEWAY_KEYS_FILE": str(self.dir / "gateway-keys.db")}
        self.subs: dict[str, str] = {}
        self.last_out = ""
        self.sbx_spec: dict[str, Any] = {"template": "base"}
        self._sbx: dict[str, dict[str, str]] = {}  # by template
        self._servers: list[tuple[Block, str, subprocess.Popen[bytes], Path]] = []
        self.block: Block | None = None  # the one running
        self._leased: list[int] = []  # fixed ports it holds (World.port)
        self.broken = ""  # why the rest of the page cannot run

    # -- blocks in order

    def run(self, block: Block, run_block: Callable[[Page, Block], None]) -> None:
        """Run ``block`` and keep how it went (a failure does not stop the page: the
        reader goes on)."""
        self.block = block
        try:
            if self.broken:
                pytest.skip(f"an earlier example of this page could not run: {self.broken}")
            run_block(self, block)
        except (Exception, pytest.skip.Exception) as exc:
            self.world.outcomes[block.where] = exc
        else:
            self.world.outcomes[block.where] = None

    def lacks(self, needs: tuple[str, ...]) -> str:
        return "; ".join(r for n in needs if (r := self.world.need(n)))

    def need(self, *needs: str) -> None:
        missing = self.lacks(needs)
        if missing:
            pytest.skip(missing)

    # -- placeholders

    def sbx(self, template: str = "") -> dict[str, str]:
        """The page's sandbox (``sbx_spec``), or one of ``template``: id and volume."""
        spec = {**self.sbx_spec, **({"template": template} if template else {})}
        if spec["template"] not in self._sbx:
            self._sbx[spec["template"]] = self.world.sandbox(self.env, **spec)
        return self._sbx[spec["template"]]

    def fill(self, cmd: str, extra: dict[str, str], template: str = "") -> str:
        for name, value in {**self.subs, **extra}.items():
            if not name.startswith("$") and name not in ("SBX", "VOL"):
                cmd = cmd.replace(name, value)
        for name, key in (("SBX", "id"), ("VOL", "volume")):
            rx = re.compile(rf"(?<![\w$]){name}\b")
            if rx.search(cmd):
                cmd = rx.sub(extra.get(name) or self.sbx(template)[key], cmd)
        return cmd

    # -- one command

    def lease(self, port: int) -> None:
        """Wait for fixed ``port`` to be this page's (another page may serve on it)."""
        if port and port not in self._leased:
            assert self.world.port(port).acquire(timeout=300), f"port {port} never freed"
            self._leased.append(port)
            deadline = time.monotonic() + 30  # a server of the page before, going away
            while _port_busy(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _port_busy(port):
                self.broken = f"port {port}, which the examples serve on, is in use here"
                pytest.skip(self.broken)

    def command(self, cmd: str, how: Run | Server | Tty, extra: dict[str, str]) -> None:
        text = self.fill(cmd, extra, how.sbx if isinstance(how, Run) else "")
        env = {**self.env, **{k[1:]: v for k, v in extra.items() if k.startswith("$")}}
        if isinstance(how, Server):
            self.start_server(text, how, env)
        elif isinstance(how, Tty):
            self._tty(cmd, text, how, env)
        else:
            self._run(cmd, text, how, env)

    def _run(self, cmd: str, text: str, how: Run, env: dict[str, str]) -> None:
        state = self.dir / ".after"
        script = (f"{text}\n__rc=$?\nenv -0 > {state}.env\npwd > {state}.pwd\nexit $__rc\n")
        cwd = ROOT if how.cwd == "repo" else self.cwd
        self.lease(how.port)
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, input=how.stdin,
                              capture_output=True, text=True, timeout=300)
        wanted = how.rc if isinstance(how.rc, tuple) else (how.rc,)
        assert done.returncode in wanted, (
            f"{self.doc}: `{cmd}` exited {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}")
        expect_in_order(done.stdout + "\n" + done.stderr, how.out, f"{self.doc}: `{cmd}`")
        self.last_out = done.stdout
        if how.capture:
            how.capture(self, done.stdout)
        if Path(f"{state}.env").exists() and how.cwd != "repo":
            after = dict(kv.split("=", 1) for kv in
                         Path(f"{state}.env").read_text().split("\0") if "=" in kv)
            for name in set(self.env) | set(after):
                if name not in BASH_OWN and after.get(name) != env.get(name):
                    if name in after:
                        self.env[name] = after[name]
                    else:
                        self.env.pop(name, None)
            self.cwd = Path(Path(f"{state}.pwd").read_text().strip())

    def start_server(self, cmd: str, how: Server, env: dict[str, str] | None = None) -> None:
        self.lease(how.port)
        log = self.dir / f"server-{len(self._servers)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=self.cwd,
                                    env={**(env or self.env), **how.env},
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        assert self.block is not None
        self._servers.append((self.block, cmd, proc, log))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{self.doc}: `{cmd}` exited {proc.returncode}:\n"
                                     f"{log.read_text()[-3000:]}")
            if (how.health and _answers(how.health)) or \
                    (how.ready and re.search(how.ready, log.read_text())):
                return
            time.sleep(0.1)
        raise AssertionError(f"{self.doc}: `{cmd}` never answered:\n{log.read_text()[-3000:]}")

    def _tty(self, cmd: str, text: str, how: Tty, env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        proc = subprocess.Popen(["bash", "-c", f"exec {text}"], cwd=self.cwd,
                                env={**env, "TERM": "xterm-256color"}, stdin=slave,
                                stdout=slave, stderr=slave, start_new_session=True,
                                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        screen = Screen()

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := os.read(master, 65536):
                    screen(data)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            for pattern, keys in how.keys:
                screen.expect(pattern, timeout=30)
                os.write(master, keys.encode())
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(5)
            os.close(master)
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.text())
        assert rc == how.rc, f"{self.doc}: `{cmd}` exited {rc}:\n{shown[-2000:]}"
        expect_in_order(shown, how.out, f"{self.doc}: `{cmd}`")

    def close(self) -> None:
        """Ctrl-C to each server it started; one that does not stop is a problem. A
        background MCP server (`abx mcp start --background`) a failed block left running
        is stopped."""
        if (self.dir / ".abx" / "run" / "mcp-server.json").exists():
            subprocess.run(["abx", "mcp", "stop", "--force"], cwd=self.dir, env=self.env,
                           capture_output=True, timeout=120)
        for block, cmd, proc, log in self._servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    if self.world.outcomes.get(block.where) is None:  # else: failed already
                        self.world.outcomes[block.where] = AssertionError(
                            f"{self.doc}: `{cmd}` ignored Ctrl-C:\n{log.read_text()[-2000:]}")
        self._servers.clear()
        for port in self._leased:
            self.world.port(port).release()
        self._leased.clear()
