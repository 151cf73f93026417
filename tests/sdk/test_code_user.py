"""Code contexts run as an account of the sandbox (``create_code_context(user="user")``):
on the embedded engine and through a gateway (the conftest runs each test for both)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, WrongStateError

pytestmark = pytest.mark.integration

_WHO = ("import os\nenv = os.environ\n"
        "print(os.getuid(), os.getgid(), env.get('HOME'), env.get('USER'), os.getcwd())")
_WRITES = """\
import os
def can_write(path):
    try:
        with open(path, 'w') as fh:
            fh.write('x')
        return 'yes:' + str(os.stat(path).st_uid)
    except PermissionError:
        return 'denied'
print(can_write('/workspace/by-kernel'), can_write(os.path.expanduser('~/by-kernel')),
      can_write('/etc/by-kernel'))
"""
# What the root kernel left in the run dir, as the account sees it.
_PEEK = """\
import os, socket
try:
    os.listdir('/.abx/run')
    listing = 'listed'
except PermissionError:
    listing = 'denied'
conn = [a for p in os.listdir('/proc') if p.isdigit()
        for a in open(f'/proc/{p}/cmdline', 'rb').read().decode().split('\\0')
        if a.startswith('/.abx/run/k') and a.endswith('.json') and '.d/' not in a][0]
try:
    open(conn).read()
    key = 'read'
except PermissionError:
    key = 'denied'
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(conn[:-len('.json')] + '-1')
    shell = 'connected'
except PermissionError:
    shell = 'denied'
print(listing, key, shell)
"""

_KILL_USER_KERNEL = """\
import os
pids = [int(p) for p in os.listdir('/proc') if p.isdigit()
        and b'.d/kernel.json' in open(f'/proc/{p}/cmdline', 'rb').read()
        and b'kernel_bridge' not in open(f'/proc/{p}/cmdline', 'rb').read()]
for pid in pids:
    os.kill(pid, 9)
print(len(pids))
"""


@pytest.fixture
def sb(code_template: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template=code_template)
    yield sandbox
    sandbox.kill(delete_volume=True)


def _run_dir(sb: Sandbox) -> set[str]:
    result = sb.commands.run("ls -A /.abx/run")
    assert result.exit_code == 0, result.stderr
    return set(result.stdout.split())


def test_a_context_runs_as_the_user(sb: Sandbox) -> None:
    r = sb.run_code(_WHO)
    assert r.stdout.split()[0:2] == ["0", "0"], r  # default: root
    ctx = sb.create_code_context(user="user")
    assert (ctx.user, ctx.cwd) == ("user", "/workspace")
    assert {(c.id, c.user) for c in sb.list_code_contexts()} == {("default", None),
                                                                   (ctx.id, "user")}
    r = sb.run_code(_WHO, context=ctx)
    assert r.error is None and r.stdout == "1000 1000 /home/user user /workspace\n", r
    r = sb.run_code(_WRITES, context=ctx)
    assert r.stdout == "yes:1000 yes:1000 denied\n", r

    # The root context's connection file, sockets and the run dir's listing stay closed.
    r = sb.run_code(_PEEK, context=ctx)
    assert r.stdout == "denied denied denied\n", r
    assert sb.run_code("import os; os.getuid()").text == "0"  # still root

    # A restart keeps the account and cleans up the old kernel's directory.
    before = {n for n in _run_dir(sb) if n.endswith(".d")}
    assert len(before) == 1
    sb.restart_code_context(ctx)
    assert sb.run_code("import os; os.getuid()", context=ctx).text == "1000"
    after = {n for n in _run_dir(sb) if n.endswith(".d")}
    assert len(after) == 1 and not after & before

    # A kernel killed from inside is replaced as the same account.
    killed = sb.run_code(_KILL_USER_KERNEL)
    assert killed.error is None and killed.stdout == "1\n", killed
    r = sb.run_code("import os; os.getuid()", context=ctx)
    assert r.text == "1000" and r.kernel_restarted, r


def test_unknown_and_invalid_accounts_are_clear_errors(sb: Sandbox) -> None:
    with pytest.raises(NotFoundError, match="no user 'nobody-here'"):
        sb.create_code_context(user="nobody-here")
    with pytest.raises(InvalidArgumentError, match="user must be an account name"):
        sb.create_code_context(user="../x")
    # An id the sandbox does not map (the root engine maps 0-65535) is refused with why.
    added = sb.commands.run("echo 'big:x:70000:70000::/tmp:/bin/sh' >> /etc/passwd")
    assert added.exit_code == 0, added.stderr
    with pytest.raises(WrongStateError, match="uid 70000 of user 'big' is not mapped"):
        sb.create_code_context(user="big")
    assert [c.id for c in sb.list_code_contexts()] == []  # nothing half-made is kept
    assert not _run_dir(sb)
