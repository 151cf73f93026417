"""The CLI's rough edges (issue 16): each one a clear message or the right behaviour,
never a traceback. Unit tests run the real ``abx`` as any user; the ones marked
integration start gateways, daemons or engines."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agent_sandbox.surfaces.gateway.process import GatewayProcess, free_port

Abx = Any  # the ``abx`` fixture of tests/cli/conftest.py


def _clean(err: str) -> None:
    assert "Traceback" not in err and "sudo" not in err, err


@pytest.fixture
def unwritable_home(tmp_path: Path) -> Path:
    """A HOME this user cannot write: a read-only directory, or for root (whom modes do
    not stop) a sysfs directory."""
    if os.geteuid() == 0:
        return Path("/sys")
    home = tmp_path / "ro-home"
    home.mkdir(mode=0o555)
    return home


# ---- HOME that cannot be written ------------------------------------------------------
def test_config_set_with_unwritable_home(abx: Abx, unwritable_home: Path) -> None:
    r = abx("config", "set", "region", "eu", env={"HOME": str(unwritable_home)}, check=1)
    _clean(r.err)
    assert f"HOME={unwritable_home} is not writable" in r.err
    assert "SANDBOX_REGION" in r.err  # the way around the file


@pytest.mark.parametrize("kind", ["unwritable", "a file"])
def test_mcp_start_background_with_bad_home(abx: Abx, unwritable_home: Path, tmp_path: Path,
                                            kind: str) -> None:
    home = unwritable_home
    if kind == "a file":
        home = tmp_path / "home-file"
        home.write_text("")
    r = abx("mcp", "start", "--http", "--background", "--port", str(free_port()),
            env={"HOME": str(home)}, check=1)
    _clean(r.err)
    assert f"HOME={home} is not writable" in r.err and "ABX_MCP_RUNTIME_DIR" in r.err


# ---- base_url ---------------------------------------------------------------------------
def test_config_set_refuses_a_bad_url(abx: Abx) -> None:
    for bad in ("notaurl", "ftp://host", "http://", "http://host:99999", "unix://relative"):
        r = abx("config", "set", "base_url", bad, check=2)
        assert "like https://" in r.err and "nothing was saved" in r.err, r.err
    assert not (abx.home / ".abx" / "config").exists()
    for good in ("https://gw.example.com", "http://127.0.0.1:8080/", "unix:///run/abx/abx.sock"):
        abx("config", "set", "base_url", good)
    r = abx("sandbox", "list", env={"ABX_SANDBOX_BASE_URL": "notaurl"}, check=2)
    assert "ABX_SANDBOX_BASE_URL" in r.err and "notaurl" in r.err


def test_a_bad_url_saved_earlier_can_be_fixed(abx: Abx) -> None:
    (abx.home / ".abx").mkdir()
    (abx.home / ".abx" / "config").write_text('{"base_url": "notaurl"}')
    r = abx("sandbox", "list", check=2)
    assert "abx config unset base_url" in r.err and "notaurl" in r.err
    abx("config", "unset", "base_url")  # the config group still works
    assert "base_url" not in abx("config", "list", "--json").out.split('"config"')[0]


# ---- a gateway that is down -------------------------------------------------------------
def test_dead_gateway_fails_in_seconds_with_what_to_check(abx: Abx) -> None:
    port = free_port()  # nothing listens there now
    start = time.monotonic()
    r = abx("sandbox", "list", env={"ABX_SANDBOX_BASE_URL": f"http://127.0.0.1:{port}"},
            check=1, timeout=20)  # it used to retry for 30 s
    elapsed = time.monotonic() - start
    assert "nothing is listening" in r.err and "abx config get base_url" in r.err, r.err
    assert "ConnectError" not in r.err
    print(f"dead gateway reported after {elapsed:.1f}s")


# ---- sandbox info and doctor rendering ----------------------------------------------------
def test_sandbox_info_is_for_people() -> None:
    from agent_sandbox.surfaces.cli.info_view import info_table

    now = 1_796_000_000.0
    data = {"sandbox_id": "sbx-x", "template": "base", "state": "running",
            "created_at": now - 3700, "last_used": now - 65, "timeout": 300.0,
            "persistent": False, "network": False, "volume_id": "vol-x",
            "metadata": {"team": "ml", "run": "7"},
            "limits": {"memory_mb": 512, "cpu": 1.5, "pids": 512, "disk_mb": 1024},
            "enforced": {"memory": True, "pids": True, "cpu": False, "disk": True},
            "owner": "", "env_names": ["A", "B"]}
    console = Console(width=100, record=True, color_system=None)
    console.print(info_table(data, now=now))
    text = console.export_text()
    assert "{" not in text and "[" not in text and str(int(now))[:6] not in text
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - 3700))
    assert f"{stamp} (1h ago)" in text and "(1m ago)" in text
    assert "memory 512 MiB" in text and "cpu 1.5 cores (not enforced here)" in text
    assert "team=ml" in text and "run=7" in text and "A, B" in text
    assert "5 min idle" in text


def test_doctor_fix_column_wraps_instead_of_cutting() -> None:
    from agent_sandbox.core.health import Check
    from agent_sandbox.surfaces.cli.doctor import checks_table

    long_path = "/home/someone/.local/share/agent-sandbox/with/a/rather/long/path"
    fix = f"mkdir -p {long_path} && chmod 711 {long_path} [see docs]"
    checks = [Check("data dir", False, f"{long_path} (created on first use)", fix),
              Check("cgroup controllers", False, "none delegated", "boot with cgroup v2 "
                    "(systemd.unified_cgroup_hierarchy=1) and log in through systemd", False)]
    console = Console(width=60, record=True, color_system=None)
    console.print(checks_table(checks))
    text = console.export_text()
    assert "…" not in text
    cells = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    column = "".join(cell[4] for cell in cells).replace(" ", "")
    for c in checks:
        assert c.fix.replace(" ", "") in column, (c.fix, text)


# ---- API key names ------------------------------------------------------------------------
def test_key_names_are_unique_and_revoke_by_name_is_never_a_guess(abx: Abx,
                                                                  tmp_path: Path) -> None:
    kf = str(tmp_path / "keys.db")
    first = abx("keys", "create", "--name", "dev", "--api-keys-file", kf, "--json").json()
    r = abx("keys", "create", "--name", "dev", "--api-keys-file", kf, check=2)
    assert first["id"] in r.err and "choose another name" in r.err
    # A database from before names were unique: two live "dev" keys.
    with sqlite3.connect(kf) as db:
        db.execute("INSERT INTO keys (id, name, hash, admin, created_at, revoked_at, "
                   "max_sandboxes, max_commands) VALUES ('key-000000000002', 'dev', 'h2', 0, "
                   "?, NULL, 1, 1)", (time.time(),))
    r = abx("keys", "revoke", "dev", "--api-keys-file", kf, check=2)
    assert first["id"] in r.err and "key-000000000002" in r.err and "give the id" in r.err
    keys = abx("keys", "list", "--api-keys-file", kf, "--json").json()
    assert not any(k["revoked"] for k in keys)  # nothing was revoked on a guess
    abx("keys", "revoke", first["id"], "--api-keys-file", kf)
    # One live "dev" left among two: the name is unambiguous again.
    out = abx("keys", "revoke", "dev", "--api-keys-file", kf, "--json").json()
    assert out["id"] == "key-000000000002" and out["revoked"]
    # A revoked name may be reused.
    abx("keys", "create", "--name", "dev", "--api-keys-file", kf)


# ---- template roots without a shell -------------------------------------------------------
def test_a_root_without_bin_sh_is_refused(tmp_path: Path) -> None:
    from agent_sandbox.backends.runc.rootfs.checks import check_shell
    from agent_sandbox.core.errors import InvalidArgumentError

    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    with pytest.raises(InvalidArgumentError, match="no executable /bin/sh"):
        check_shell(root)
    os.symlink("/bin/sh", root / "bin" / "sh")  # the host's shell: outside this root
    with pytest.raises(InvalidArgumentError, match="no executable /bin/sh"):
        check_shell(root)
    (root / "bin" / "sh").unlink()
    os.symlink("../../../../../../../bin/sh", root / "bin" / "sh")  # climbs out: clamped
    with pytest.raises(InvalidArgumentError):
        check_shell(root)
    (root / "bin" / "sh").unlink()
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "dash").write_text("#!\n")
    os.symlink("/usr/bin/dash", root / "bin" / "sh")
    with pytest.raises(InvalidArgumentError):  # there, but not executable
        check_shell(root)
    os.chmod(root / "usr" / "bin" / "dash", 0o755)
    check_shell(root)


@pytest.mark.integration
def test_template_build_refuses_a_root_without_a_shell(abx: Abx, tmp_path: Path) -> None:
    root = tmp_path / "noshell"
    (root / "etc").mkdir(parents=True)
    r = abx("template", "build", f"noshell-{os.getpid()}", str(root), check=2, timeout=120)
    assert "no executable /bin/sh" in r.err
    _clean(r.err)


# ---- abx serve on a busy port -------------------------------------------------------------
@pytest.mark.integration
def test_serve_on_a_busy_port_says_so_before_serving(abx: Abx, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = abx("serve", "--port", str(port), "--api-keys-file", str(tmp_path / "k.db"),
                check=1, timeout=60)
    assert f"port {port} on 127.0.0.1 is already in use" in r.err and "--port" in r.err
    assert "serving on" not in r.err and "ERROR" not in r.err and "Errno" not in r.err
    _clean(r.err)


# ---- template commands follow the engine `sandbox create` uses ------------------------------
@pytest.mark.integration
def test_template_commands_through_a_gateway(abx: Abx, gateway: GatewayProcess,
                                             tmp_path: Path) -> None:
    env = {"ABX_SANDBOX_BASE_URL": gateway.url}
    listed = abx("template", "list", "--json", env=env).json()
    assert "base" in {t["name"] for t in listed}
    assert "base" in abx("template", "list", env=env).out
    r = abx("template", "build", "x", str(tmp_path), env=env, check=2)
    assert "gateway's host" in r.err and gateway.url in r.err
    assert "gateway's host" in abx("template", "remove", "x", env=env, check=2).err


@pytest.mark.integration
def test_template_commands_of_a_daemon_user(abx: Abx, tmp_path: Path) -> None:
    sock = str(tmp_path / "d.sock")
    proc = subprocess.Popen([*abx.command, "serve", "--unix", sock, "--group", "root",
                             "--api-keys-file", str(tmp_path / "k.db")], env=abx.env,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (os.path.exists(sock) and stat.S_ISSOCK(os.stat(sock).st_mode)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        env = {"ABX_ENGINE": "daemon", "ABX_DAEMON_SOCKET": sock}
        assert "base" in {t["name"] for t in abx("template", "list", "--json",
                                                  env=env).json()}
        r = abx("template", "build", "x", str(tmp_path), env=env, check=2)
        assert "abx daemon" in r.err and "sudo abx template build" in r.err
        r = abx("template", "build", "x", str(tmp_path),
                env={"ABX_SANDBOX_BASE_URL": "unix://" + sock}, check=2)
        assert "abx daemon" in r.err
    finally:
        proc.terminate()
        proc.wait(30)


# ---- sandbox ids, as help shows them and as errors explain them --------------------------
def _commands() -> list[tuple[str, Any]]:
    """Every command of ``abx`` as click sees it, by its full name."""
    import typer.main

    from agent_sandbox.surfaces.cli.app import app

    out: list[tuple[str, Any]] = []

    def walk(name: str, command: Any) -> None:
        out.append((name, command))
        for sub, child in getattr(command, "commands", {}).items():
            walk(f"{name} {sub}", child)

    walk("abx", typer.main.get_command(app))
    return out


def test_help_examples_use_ids_that_are_ids() -> None:
    from agent_sandbox.core.validate import sandbox_id

    seen = 0
    for _, command in _commands():
        for text in (command.epilog or "", command.help or ""):
            for token in re.findall(r"\bsbx?-[A-Za-z0-9]+", text):
                sandbox_id(token)  # raises for sb-1234 and sbx-1234
                seen += 1
    assert seen > 20


def test_a_bad_sandbox_id_points_at_abx_sandbox_list(abx: Abx) -> None:
    env = {"ABX_SANDBOX_BASE_URL": f"http://127.0.0.1:{free_port()}"}  # never reached
    for command in (["sandbox", "info", "sb-1234"], ["sandbox", "exec", "sb-1234", "true"],
                    ["sandbox", "upload", "sb-1234", ".", "/workspace/"],
                    ["sandbox", "kill", "sb-1234"]):
        r = abx(*command, env=env, check=2)
        assert "invalid sandbox id 'sb-1234'" in r.err and "`abx sandbox list`" in r.err, r.err
        assert "list_sandboxes" not in r.err  # the MCP tool's name, not a command
        _clean(r.err)


# ---- a gateway that wants a key -----------------------------------------------------------
@pytest.mark.integration
def test_a_missing_or_refused_key_names_the_setting(abx: Abx) -> None:
    from gateways import running_gateway

    with running_gateway("abx-cli-keys-", {"ci": {}}) as (gw, store, tokens):
        env = {"ABX_SANDBOX_BASE_URL": gw.url}
        r = abx("sandbox", "list", env=env, check=1)
        assert f"the gateway at {gw.url} needs an API key" in r.err, r.err
        assert "ABX_SANDBOX_API_KEY" in r.err and "abx config set sandbox_api_key" in r.err
        assert "Authorization" not in r.err and "Bearer" not in r.err
        r = abx("sandbox", "list", env={**env, "ABX_SANDBOX_API_KEY": "abx_wrong"}, check=1)
        assert "refused the API key from ABX_SANDBOX_API_KEY" in r.err, r.err
        assert "abx_wrong" not in r.err  # a secret is never printed
        abx("config", "set", "sandbox_api_key", "abx_wrong_too")
        r = abx("sandbox", "list", env=env, check=1)
        assert f"sandbox_api_key in {abx.home}/.abx/config" in r.err, r.err
        abx("config", "set", "sandbox_api_key", tokens["ci"])
        assert abx("sandbox", "list", "--json", env=env).json() == []
        _clean(r.err)


# ---- limits beyond the host ---------------------------------------------------------------
@pytest.mark.integration
def test_memory_and_cpu_past_the_host_are_refused_everywhere(abx: Abx,
                                                            gateway: GatewayProcess) -> None:
    """--memory-mb is bounded by the host's memory as --cpu is by its CPUs: on every
    surface, before anything is made, with a message naming the bound."""
    import httpx2 as httpx

    from agent_sandbox import Sandbox
    from agent_sandbox.core.errors import InvalidArgumentError
    from agent_sandbox.providers.local import local_provider

    caps = local_provider().backend.limit_caps()
    memory, cpus = caps["memory_mb"][0], caps["cpu"][0]
    says = f"memory_mb must be at most {memory} (this host's memory, in MiB)"
    r = abx("sandbox", "create", "--memory-mb", str(memory + 1), check=2)
    assert says in r.err, r.err
    r = abx("sandbox", "create", "--cpu", str(cpus + 1), check=2)
    assert f"cpu must be at most {cpus} (this host's CPUs)" in r.err, r.err
    with pytest.raises(InvalidArgumentError, match=re.escape(says)):
        Sandbox.create(memory_mb=memory + 1)
    r = httpx.post(gateway.url + "/v1/sandboxes", json={"memory_mb": memory + 1}, timeout=30)
    assert r.status_code == 400 and says in r.json()["message"], r.text
    r = abx("sandbox", "create", "--memory-mb", str(memory + 1), check=2,
            env={"ABX_SANDBOX_BASE_URL": gateway.url})
    assert says in r.err, r.err
    assert not [i for i in Sandbox.list() if i.limits["memory_mb"] > memory]  # none made


# ---- run-code with a figure -----------------------------------------------------------------
@pytest.mark.integration
def test_run_code_prints_text_results_and_saves_figures(abx: Abx, code_template: str,
                                                        tmp_path: Path) -> None:
    sid = abx("sandbox", "create", "--template", code_template).out.strip()
    try:
        cell = ("import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
                "display('shown')\nplt.figure(figsize=(2, 1)); plt.plot([1, 3, 2])\n"
                "plt.show()\n6 * 7")
        r = abx("sandbox", "run-code", sid, cell)
        # Every text result (a display(), the figure's, the last value), in order.
        assert r.out.split("\n")[:3] == ["'shown'", r.out.split("\n")[1], "42"], r.out
        assert r.out.split("\n")[1].startswith("<Figure size"), r.out
        assert "1 image (result 2: png): save it with --save-dir DIR" in r.err, r.err
        plots = tmp_path / "plots"
        for _ in range(2):  # a second run keeps the first one's file
            r = abx("sandbox", "run-code", sid, "--save-dir", str(plots), cell)
        saved = sorted(p.name for p in plots.iterdir())
        assert saved == ["image-1.png", "image-2.png"], saved
        assert (plots / "image-1.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert "saved the png of result 2 (" in r.err and f"as {plots}/image-2.png" in r.err
        out = abx("sandbox", "run-code", sid, "--json", "--save-dir", str(plots), cell)
        assert out.json()["results"][1]["png"]  # stdout stays JSON
        assert (plots / "image-3.png").exists()
    finally:
        abx("sandbox", "kill", sid, "--delete-volume")


# ---- help as people read it ---------------------------------------------------------------
def test_help_lists_read_as_sentences_and_flags_take_no_type(abx: Abx) -> None:
    """A command list shows each command's first paragraph as prose (typer's rich help kept
    the docstring's line breaks: it broke mid-sentence), and a flag has no type (it read
    `--json <bool>`, as if it took a value)."""
    import inspect

    groups = {name: command for name, command in _commands() if getattr(command, "commands",
                                                                         None)}
    leaves = ["abx sandbox create", "abx sandbox exec", "abx keys create", "abx doctor"]
    with ThreadPoolExecutor(4) as pool:
        outs = dict(zip([*groups, *leaves], pool.map(
            lambda name: abx(*name.split()[1:], "--help").out, [*groups, *leaves]),
            strict=True))
    for name, out in outs.items():
        assert "<bool>" not in out, (name, out)
    checked = 0
    for name, group in groups.items():
        lines = [" ".join(line.strip("│ ").split()) for line in outs[name].splitlines()]
        for sub, command in group.commands.items():
            first = " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())
            if first and len(first) < 150 and not command.hidden:  # (an alias is hidden)
                assert f"{sub} {first}" in lines, (name, sub, first, outs[name])
                checked += 1
    assert checked > 30


# ---- tables through a pipe ------------------------------------------------------------------
def test_tables_are_whole_when_piped(abx: Abx, tmp_path: Path) -> None:
    """Piped (no terminal, no COLUMNS), a table takes the width its cells need: it was cut
    at 80 columns, `abx keys list | grep` saw `key-46a…`."""
    kf = str(tmp_path / "keys.db")
    made = [abx("keys", "create", "--name", f"a-rather-long-name-for-a-ci-key-{i}",
                "--network", "pypi.org,files.pythonhosted.org", "--api-keys-file", kf,
                "--json").json() for i in range(2)]
    out = abx("keys", "list", "--api-keys-file", kf, env={"COLUMNS": ""}).out
    assert "…" not in out, out
    for key in made:
        row = next(line for line in out.splitlines() if key["id"] in line)
        assert key["name"] in row and "pypi.org, files.pythonhosted.org" in row, out
    # COLUMNS, when set, is still the width asked for.
    assert "…" in abx("keys", "list", "--api-keys-file", kf, env={"COLUMNS": "60"}).out


def test_run_code_results_are_hostile_input(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """What a kernel sends names no file, carries no markup or escape to the terminal's
    notes, and a bad image is skipped with a word, not a traceback."""
    from agent_sandbox.core.models import Result
    from agent_sandbox.surfaces.cli import cell_output

    results = [Result.from_bundle({"text/x-\x1b[31m[bold]": "x"}),
               Result.from_bundle({"image/png": "!!not base64", "text/plain": "<Figure>"}),
               Result.from_bundle({"image/svg+xml": "<svg/>", "image/jpeg": "/9j/"})]
    plots = tmp_path / "[red]plots"
    cell_output.show(results, plots)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "text/x-?[31m[bold]" in err
    assert "its png is not valid base64 (not saved)" in err
    assert f"as {plots}/image-1.svg" in err  # the path as given: no markup taken from it
    assert sorted(p.name for p in plots.iterdir()) == ["image-1.jpg", "image-1.svg"]
