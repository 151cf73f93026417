"""``commands.run(user="user")`` and a code context as ``user`` in a rootless sandbox, as a
real unprivileged user: uid 1000 is one of the subordinate ids the engine maps (Debian's
useradd gives every user a /etc/subuid range), so the account works, owns its home and
/workspace. (A sandbox with only the engine user's own id refuses it with the reason:
tests/guest/test_users.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.integration

_SCRIPT = """
import json
from agent_sandbox import Sandbox
with Sandbox.create() as sb:
    r = sb.commands.run('id -u; id -un; stat -c %U /workspace; touch ~/mine /workspace/mine '
                        '&& stat -c %U ~/mine /workspace/mine; echo $HOME', user='user')
    root = sb.commands.run('id -u; cat /proc/self/uid_map')
    print(json.dumps({"user": [r.exit_code, r.stdout, r.stderr], "root": root.stdout}))
"""

_CODE = """
import json
from agent_sandbox import Sandbox
with Sandbox.create(template='code-interpreter-v1') as sb:
    ctx = sb.create_code_context(user='user')
    r = sb.run_code("import os; open('/workspace/k', 'w').close(); "
                    "print(os.getuid(), os.environ['HOME'], os.stat('/workspace/k').st_uid)",
                    context=ctx)
    root = sb.run_code("import os; print(os.getuid())")
    print(json.dumps({"user": [r.stdout, str(r.error)], "root": root.stdout}))
"""


@pytest.fixture(scope="module")
def user(local_users: Any) -> Any:
    return local_users.create_rootless()


def test_the_user_account_in_a_rootless_sandbox(user: Any) -> None:
    done = user.run([user.python(), "-c", _SCRIPT], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    code, stdout, stderr = out["user"]
    assert code == 0, stderr
    assert stdout.splitlines() == ["1000", "user", "user", "user", "user", "/home/user"]
    assert out["root"].splitlines()[0] == "0"
    assert len(out["root"].splitlines()) >= 3  # root plus a subordinate range: 1000 mapped


def test_a_code_context_as_the_user_in_a_rootless_sandbox(user: Any, code_template: str
                                                          ) -> None:
    done = user.run([user.python(), "-c", _CODE], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["user"] == ["1000 /home/user 1000\n", "None"], out
    assert out["root"] == "0\n"
