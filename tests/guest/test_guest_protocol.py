"""End-to-end tests of the guest agent through GuestClient (real agent subprocess)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _agent import AGENT, GUEST_PYTHON

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError
from agent_sandbox.guest import ops as guest_ops
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError


def _start_guest(
    args: list[str],
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [GUEST_PYTHON, "-I", "-S", str(AGENT), *args], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("abx-guest ready"), line
    return proc, line.split()[3]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GuestClient, int]]:
    sock = str(tmp_path_factory.mktemp("guest") / "g.sock")
    proc, _ = _start_guest(["--unix", sock])
    try:
        yield GuestClient(sock), proc.pid
    finally:
        _stop(proc)


@pytest.fixture
def client(guest: tuple[GuestClient, int]) -> GuestClient:
    return guest[0]


def _state(pid: int) -> str | None:
    """Process state letter from /proc, None if the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _dead(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.02)
    return False


def _children(ppid: int) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                rest = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(rest[1]) == ppid:
                found.append((int(entry.name), rest[0]))
    return found


# ---------------------------------------------------------------- processes


def test_ping(guest: tuple[GuestClient, int]) -> None:
    client, pid = guest
    info = client.ping()
    assert info["pid"] == pid and info["version"] == 1
    assert re.fullmatch(r"3\.\d+\.\d+", info["python"])


def test_exec_exit_codes_and_streams(client: GuestClient, tmp_path: Path) -> None:
    res = client.exec(["sh", "-c", "echo out; echo err >&2; exit 7"], cwd=str(tmp_path))
    assert (res.exit_code, res.stdout, res.stderr) == (7, b"out\n", b"err\n")
    assert not res.truncated and not res.timed_out and res.pid > 0
    assert client.exec(["true"], cwd="/").exit_code == 0
    assert client.exec(["sh", "-c", "kill -TERM $$"], cwd="/").exit_code == 128 + 15


def test_exec_cwd_and_env(client: GuestClient, tmp_path: Path) -> None:
    res = client.exec(
        ["sh", "-c", "pwd; echo $FOO; echo ${HOME:-unset}"],
        cwd=str(tmp_path),
        env={"FOO": "bar baz", "PATH": "/usr/bin:/bin"},
    )
    assert res.stdout.decode().splitlines() == [str(tmp_path), "bar baz", "unset"]


def test_exec_errors(client: GuestClient, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no such program"):
        client.exec(["definitely-not-a-program-xyz"], cwd="/")
    with pytest.raises(NotFoundError, match="working directory"):
        client.exec(["true"], cwd=str(tmp_path / "missing"))
    with pytest.raises(InvalidArgumentError, match="absolute"):
        client.exec(["true"], cwd="relative")
    with pytest.raises(InvalidArgumentError, match="argv"):
        client.exec([], cwd="/")
    with pytest.raises(InvalidArgumentError, match="NUL"):
        client.exec(["echo", "a\0b"], cwd="/")


def test_exec_streams_live(client: GuestClient) -> None:
    seen: list[tuple[float, bytes]] = []
    res = client.exec(
        ["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.1; done"],
        cwd="/",
        on_stdout=lambda b: seen.append((time.monotonic(), b)),
    )
    end = time.monotonic()
    assert res.stdout == b"".join(f"{i}\n".encode() for i in range(1, 9))
    assert b"".join(chunk for _, chunk in seen) == res.stdout
    assert len(seen) >= 4  # chunks arrive separately, not batched at the end
    assert end - seen[0][0] > 0.4  # first callback long before the command ended


def test_exec_tail_truncation(client: GuestClient) -> None:
    res = client.exec(
        ["sh", "-c", "yes abcdefgh | head -c 300000; printf END"], cwd="/", max_output=1000
    )
    assert res.truncated and len(res.stdout) == 1000 and res.stdout.endswith(b"\nabcEND")
    small = client.exec(["printf", "x" * 100], cwd="/", max_output=1000)
    assert not small.truncated and small.stdout == b"x" * 100


def test_exec_timeout_kills_group(client: GuestClient) -> None:
    start = time.monotonic()
    res = client.exec(["sh", "-c", "sleep 30 & echo $!; wait"], cwd="/", timeout=0.5)
    assert time.monotonic() - start < 5
    assert res.timed_out and res.exit_code == 137
    assert _dead(int(res.stdout.split()[0]))  # the grandchild went with the group


def test_exec_stdin(client: GuestClient) -> None:
    assert client.exec(["cat"], cwd="/", stdin=b"hello\n").stdout == b"hello\n"
    big = os.urandom(3 << 20)
    res = client.exec(["sha256sum"], cwd="/", stdin=iter([big[:1000], big[1000:]]))
    assert res.stdout.split()[0].decode() == hashlib.sha256(big).hexdigest()
    res = client.exec(["sh", "-c", "head -c 3 >/dev/null; echo done"], cwd="/", stdin=big)
    assert res.stdout == b"done\n" and res.exit_code == 0  # child closing stdin early is fine


def test_client_disconnect_kills_foreground(client: GuestClient) -> None:
    marker = f"abx-disconnect-{os.getpid()}"

    def boom(_: bytes) -> None:
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError):
        client.exec(["sh", "-c", f"echo go; exec sleep 30 # {marker}"], cwd="/", on_stdout=boom)
    procs = [p for p in client.ps() if marker in " ".join(p["argv"])]
    assert len(procs) == 1
    assert _dead(procs[0]["pid"])


def test_background_lifecycle(client: GuestClient) -> None:
    pid = client.start(["sh", "-c", "echo first; echo e >&2; sleep 0.3; echo second"], cwd="/")
    time.sleep(0.15)
    out = client.output(pid)
    assert out.running and out.exit_code is None
    assert (out.stdout, out.stderr) == (b"first\n", b"e\n")
    got: list[bytes] = []
    res = client.wait(pid, on_stdout=got.append)
    assert res.exit_code == 0 and not res.timed_out
    assert res.stdout == b"first\nsecond\n" and b"".join(got) == res.stdout
    done = client.output(pid)
    assert not done.running and done.exit_code == 0 and done.stdout == b"first\nsecond\n"
    listed = {p["pid"]: p for p in client.ps()}
    assert listed[pid]["running"] is False and listed[pid]["exit_code"] == 0
    assert listed[pid]["argv"][0] == "sh" and listed[pid]["started_at"] > 0


def test_output_larger_than_one_frame(client: GuestClient) -> None:
    script = "head -c 3000000 /dev/zero; head -c 2500000 /dev/zero | tr '\\0' e >&2"
    pid = client.start(["sh", "-c", script], cwd="/", max_output=4 << 20)
    assert client.wait(pid, timeout=10).exit_code == 0
    out = client.output(pid, max_output=4 << 20)
    assert out.stdout == b"\0" * 3000000 and out.stderr == b"e" * 2500000
    assert not out.truncated


def test_wait_timeout_and_kill(client: GuestClient) -> None:
    pid = client.start(["sleep", "30"], cwd="/")
    res = client.wait(pid, timeout=0.2)
    assert res.timed_out and res.exit_code == -1
    assert client.output(pid).running  # waiting does not kill
    assert client.kill(pid, signal=15) is True
    res = client.wait(pid, timeout=5)
    assert res.exit_code == 128 + 15 and not res.timed_out
    assert client.kill(pid) is False
    with pytest.raises(NotFoundError):
        client.kill(999999)
    with pytest.raises(NotFoundError):
        client.output(999999)


def test_send_stdin_background(client: GuestClient) -> None:
    pid = client.start(["cat"], cwd="/", stdin_open=True)
    client.send_stdin(pid, b"abc")
    client.send_stdin(pid, b"def", close=True)
    res = client.wait(pid, timeout=5)
    assert res.exit_code == 0 and res.stdout == b"abcdef"
    with pytest.raises(WrongStateError):
        client.send_stdin(pid, b"more")
    other = client.start(["sleep", "0.1"], cwd="/")
    with pytest.raises(WrongStateError, match="stdin_open"):
        client.send_stdin(other, b"x")


def test_children_are_reaped(guest: tuple[GuestClient, int]) -> None:
    client, guest_pid = guest
    for _ in range(5):
        client.exec(["sh", "-c", "sleep 0.05 & exit 0"], cwd="/")
        client.start(["true"], cwd="/")
    time.sleep(0.3)
    assert [c for c in _children(guest_pid) if c[1] == "Z"] == []


def test_many_concurrent_execs(client: GuestClient) -> None:
    results: list[int] = []

    def run(i: int) -> None:
        results.append(int(client.exec(["sh", "-c", f"echo {i}"], cwd="/").stdout))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(20))


# ---------------------------------------------------------------- files


def test_big_file_roundtrip(client: GuestClient, tmp_path: Path) -> None:
    data = os.urandom(50 << 20)
    target = str(tmp_path / "deep" / "dir" / "big.bin")
    assert client.write(target, data) == len(data)
    assert hashlib.sha256(Path(target).read_bytes()).digest() == hashlib.sha256(data).digest()
    chunks = list(client.read(target))
    assert len(chunks) >= 50 and max(map(len, chunks)) <= 1 << 20
    assert b"".join(chunks) == data
    assert b"".join(client.read(target, offset=10, limit=100)) == data[10:110]
    assert client.write(target, io.BytesIO(b"from a file object")) == 18
    assert Path(target).read_bytes() == b"from a file object"


def test_write_modes_append_and_iterables(client: GuestClient, tmp_path: Path) -> None:
    path = str(tmp_path / "script.sh")
    client.write(path, [b"#!/bin/sh\n", b"echo hi\n"], mode=0o755)
    assert os.stat(path).st_mode & 0o777 == 0o755
    client.write(path, b"echo again\n", append=True)
    assert Path(path).read_bytes() == b"#!/bin/sh\necho hi\necho again\n"
    assert client.exec([path], cwd="/").stdout == b"hi\nagain\n"
    assert client.write(str(tmp_path / "empty"), b"") == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_read_stream_closes_early(client: GuestClient, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (3 << 20))
    stream = client.read(str(path))
    assert len(next(stream)) == 1 << 20
    stream.close()  # type: ignore[attr-defined]
    assert client.exists(str(path))  # the guest survived the aborted stream


def test_list_stat_exists(client: GuestClient, tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "f.txt").write_text("hello")
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    os.symlink("f.txt", tmp_path / "a" / "link")
    top = client.list(str(tmp_path))
    assert [e["name"] for e in top] == ["a"] and top[0]["type"] == "dir"
    two = {e["path"][len(str(tmp_path)) :]: e for e in client.list(str(tmp_path), depth=2)}
    assert set(two) == {"/a", "/a/b", "/a/f.txt", "/a/link"}
    assert two["/a/f.txt"]["size"] == 5 and two["/a/f.txt"]["type"] == "file"
    assert two["/a/link"]["type"] == "symlink" and two["/a/link"]["target"] == "f.txt"
    everything = client.list(str(tmp_path), depth=10)
    assert any(e["path"].endswith("/c/deep.txt") for e in everything)
    st = client.stat(str(tmp_path / "a" / "f.txt"))
    assert st["type"] == "file" and st["size"] == 5
    assert st["mode"] == os.stat(tmp_path / "a" / "f.txt").st_mode & 0o7777
    assert client.stat(str(tmp_path / "a" / "link"))["type"] == "symlink"  # lstat
    assert client.exists(str(tmp_path / "a")) and not client.exists(str(tmp_path / "zz"))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        client.list(str(tmp_path / "a" / "f.txt"))
    with pytest.raises(NotFoundError):
        client.list(str(tmp_path / "nope"))


def test_list_cap(client: GuestClient, tmp_path: Path) -> None:
    for i in range(10050):
        (tmp_path / f"f{i}").touch()
    entries = client.list(str(tmp_path))
    assert len(entries) == 10000


def test_mkdir_remove_rename(client: GuestClient, tmp_path: Path) -> None:
    d = str(tmp_path / "x" / "y")
    client.mkdir(d)
    assert os.path.isdir(d)
    client.mkdir(d)  # parents=True is idempotent
    with pytest.raises(InvalidArgumentError):
        client.mkdir(d, parents=False)
    client.write(d + "/f", b"1")
    client.rename(d + "/f", d + "/g")
    assert Path(d, "g").read_bytes() == b"1" and not os.path.exists(d + "/f")
    with pytest.raises(InvalidArgumentError):
        client.remove(str(tmp_path / "x"), recursive=False)
    client.remove(str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x")
    with pytest.raises(NotFoundError):
        client.remove(str(tmp_path / "x"))
    with pytest.raises(NotFoundError):
        client.rename(str(tmp_path / "nope"), str(tmp_path / "z"))
    for root in ("/", "//", "/tmp/.."):
        with pytest.raises(InvalidArgumentError, match="refusing"):
            client.remove(root)


def test_path_errors(client: GuestClient, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="absolute"):
        client.stat("relative/path")
    with pytest.raises(InvalidArgumentError, match="NUL"):
        client.exists("/tmp/a\0b")
    with pytest.raises(NotFoundError):
        client.read(str(tmp_path / "missing"))
    with pytest.raises(NotFoundError):
        client.stat(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        client.read(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="is a directory"):
        client.write(str(tmp_path), b"data")
    with pytest.raises(InvalidArgumentError, match="absolute"):
        client.write("rel", b"data" * 1000)


# ---------------------------------------------------------------- protocol robustness


def _raw(client: GuestClient) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    assert isinstance(client.address, str)
    sock.connect(client.address)
    return sock


def test_malformed_frames_do_not_crash(client: GuestClient) -> None:
    bad_frames = [
        struct.pack("!II", 0xFFFFFFFF, 0),  # json too large
        struct.pack("!II", 2, 5 << 20) + b"{}",  # payload too large
        struct.pack("!II", 5, 0) + b"[1,2]",  # not an object
        struct.pack("!II", 4, 0) + b"\xff\xfe{}",  # not UTF-8 JSON
        struct.pack("!II", 100, 0) + b"{",  # truncated, then EOF
        b"\x00\x00",  # truncated header
    ]
    for frame in bad_frames:
        sock = _raw(client)
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        sock.close()
        assert client.ping()["version"] == 1
    # The op table (guest/ops.py) is the one list: every op it names (HELLO is the
    # handshake's frame, not an op), and only those.
    known = ", ".join(sorted(v for k, v in vars(guest_ops).items()
                             if k.isupper() and isinstance(v, str) and k != "HELLO"))
    with pytest.raises(InvalidArgumentError, match=f"unknown op 'frobnicate'; known ops: {known}$"):
        client._call({"op": "frobnicate"})


@pytest.mark.parametrize("sizes", [[], [3, 0, 5], [65536, 65536, 1], [1 << 20] * 4])
def test_a_frame_sent_in_parts_is_one_frame(sizes: list[int]) -> None:
    from agent_sandbox.guest import protocol as proto

    parts = [os.urandom(n) for n in sizes]
    left, right = socket.socketpair()
    with left, right, right.makefile("rb") as rfile:
        sender = threading.Thread(target=proto.send_frame_parts,
                                  args=(left, {"stream": "stdout"}, parts))
        sender.start()
        assert proto.read_frame(rfile) == ({"stream": "stdout"}, b"".join(parts))
        sender.join(5)
        with pytest.raises(proto.ProtocolError, match="too large"):
            proto.send_frame_parts(left, {}, [b"x" * proto.MAX_BIN, b"y"])


def test_unavailable_guest(tmp_path: Path) -> None:
    with pytest.raises(GuestUnavailableError):
        GuestClient(str(tmp_path / "nothing.sock")).ping()


def test_tcp_token(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ABX_GUEST_TOKEN": "s3cret"}
    proc, addr = _start_guest(["--tcp", "127.0.0.1:0"], env=env)
    try:
        host, port = addr.rsplit(":", 1)
        good = GuestClient((host, int(port)), token="s3cret")
        assert good.ping()["version"] == 1
        res = good.exec(["sh", "-c", "echo ${ABX_GUEST_TOKEN:-none}"], cwd="/", env=None)
        assert res.stdout == b"none\n"  # the token never reaches sandboxed processes
        good.write(str(tmp_path / "t"), b"tcp")
        assert b"".join(good.read(str(tmp_path / "t"))) == b"tcp"
        with pytest.raises(InvalidArgumentError, match="wrong guest token"):
            GuestClient((host, int(port)), token="wrong").ping()
        with pytest.raises(InvalidArgumentError, match="authentication required"):
            GuestClient((host, int(port))).ping()
        assert good.ping()["version"] == 1
    finally:
        _stop(proc)


def test_tcp_requires_token() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    res = subprocess.run(
        [GUEST_PYTHON, "-I", "-S", str(AGENT), "--tcp", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert res.returncode == 2 and "ABX_GUEST_TOKEN" in res.stderr


def test_sigterm_kills_children_and_exits_zero(tmp_path: Path) -> None:
    sock = str(tmp_path / "g.sock")
    proc, _ = _start_guest(["--unix", sock])
    client = GuestClient(sock)
    pid = client.start(["sleep", "30"], cwd="/")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    assert _dead(pid)
    assert not os.path.exists(sock)


def test_output_of_a_tail_bigger_than_a_frame(client: GuestClient) -> None:
    """A stored tail over one frame's cap (max_output may be up to 64 MiB) comes back
    whole, in pieces, instead of failing with "frame too large"."""
    big = 6 << 20
    pid = client.start(["/bin/sh", "-c", f"head -c {big} /dev/zero | tr '\\0' a; "
                        "echo tail >&2"], cwd="/", max_output=8 << 20)
    client.wait(pid, timeout=30)
    out = client.output(pid, max_output=8 << 20)
    assert (len(out.stdout), out.stderr, out.exit_code) == (big, b"tail\n", 0)
    assert set(out.stdout) == {ord("a")} and not out.truncated


def test_the_op_table_is_what_the_guest_serves_and_the_host_calls() -> None:
    """guest/ops.py names every operation once: the guest serves exactly those (HELLO is
    the connection's first frame, not an operation), and the host sends no other."""
    import re
    from pathlib import Path

    from agent_sandbox.guest import ops
    from agent_sandbox.guest.server import Agent

    table = {v for k, v in vars(ops).items() if k.isupper()}
    agent = Agent(None)
    assert {op for op in table if agent.handler(op) is not None} == table - {ops.HELLO}
    assert set(agent.ops) == table - {ops.HELLO}
    host = Path(ops.__file__).parents[1]
    for source in [*host.glob("guestlink/*.py"), *host.glob("service/**/*.py")]:
        assert not re.search(r'"op": "(?!execute")', source.read_text()), source


def test_pid_1_answers_before_it_imports_what_a_first_command_does_not_need() -> None:
    """Every cold create waits for pid 1's imports: the terminal, watch, archive and port
    operations (and ctypes) are left out of its start, then loaded once, on first use."""
    import subprocess
    import sys

    from agent_sandbox.guest import SOURCE_DIR, ops
    from agent_sandbox.guest.server import LATER, Agent

    probe = (f"import sys; sys.path.insert(0, {str(SOURCE_DIR)!r}); import agent; "
             "import os; agent._not_dumpable() if os.geteuid() == 0 else None; "
             f"print(sorted(set(sys.modules) & set({sorted([*LATER, 'ctypes'])!r})))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
    agent = Agent(None)
    later = {op for names in LATER.values() for op in names}
    assert not set(agent.ops) & later
    first = agent.handler(ops.PTY_LIST)
    assert first is not None and agent.handler(ops.PTY_LIST) == first  # one PtyOps
    assert agent.handler(ops.PTY_CREATE).__self__ is first.__self__  # type: ignore[union-attr]


def test_a_guest_whose_code_the_sandbox_could_write_imports_everything_at_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A late import finds its module by path: from a writable guest directory (a Pod's
    image layer) nothing is left for later, once sandbox code runs."""
    from agent_sandbox.guest import agent as guest_agent
    from agent_sandbox.guest import ops
    from agent_sandbox.guest.server import LATER

    later = {op for names in LATER.values() for op in names}
    monkeypatch.setattr(guest_agent, "_read_only", lambda path: False)
    assert later <= set(guest_agent.new_agent(None).ops)
    monkeypatch.setattr(guest_agent, "_read_only", lambda path: True)
    assert not later & set(guest_agent.new_agent(None).ops)
    assert ops.PING in guest_agent.new_agent(None).ops
