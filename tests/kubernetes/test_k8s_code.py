"""``run_code`` on the Kubernetes provider: the code-interpreter-v1 image carries ipykernel
and our kernel bridge; state, plots, errors and per-account contexts work in a Pod."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def code_sandbox(k8s_cluster: Any, code_template: str) -> Iterator[Sandbox]:
    k8s_cluster.pushed(code_template)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in k8s_cluster.env.items():
            mp.setenv(name, value)
        sb = Sandbox.create(template=code_template)
        try:
            yield sb
        finally:
            sb.kill(delete_volume=True)


def test_cells_keep_state_plot_and_fail_cleanly(code_sandbox: Sandbox) -> None:
    first = code_sandbox.run_code("x = 41\nprint(x + 1)")
    assert first.logs["stdout"] == "42\n" and first.error is None
    assert code_sandbox.run_code("x").text == "41"
    plot = code_sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\n"
                                 "plt.show()")
    pngs = [r.png for r in plot.results if r.png]
    assert len(pngs) == 1
    import base64

    assert base64.b64decode(pngs[0]).startswith(PNG)
    failed = code_sandbox.run_code("1/0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"


def test_a_context_of_an_account_runs_as_that_account(code_sandbox: Sandbox) -> None:
    ctx = code_sandbox.create_code_context(user="user")
    try:
        ran = code_sandbox.run_code("import os\nprint(os.getuid(), os.getcwd())", context=ctx)
        assert ran.error is None, ran.error
        assert ran.logs["stdout"] == "1000 /workspace\n"
    finally:
        code_sandbox.remove_code_context(ctx)
