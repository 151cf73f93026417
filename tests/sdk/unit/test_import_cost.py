"""The SDK and a remote client load nothing of the engine (``agent_sandbox.backends``:
rootless probes, ctypes syscalls, subid parsing): a fresh interpreter shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json, sys
loaded = lambda: sorted(m for m in sys.modules if m.startswith("agent_sandbox.backends"))
import agent_sandbox
after_import = loaded()
{step}
print(json.dumps({{"import": after_import, "step": loaded()}}))
"""


def _probe(step: str, **env: str) -> dict[str, list[str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(step=step)],
                         env={**clean, **env}, capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_import_and_remote_client_load_no_engine_module() -> None:
    # The provider the SDK picks from ABX_SANDBOX_BASE_URL; nothing listens there:
    # building the client does no I/O.
    step = ("from agent_sandbox.providers import default_provider\n"
            "assert type(default_provider()).__name__ == 'RemoteProvider'")
    seen = _probe(step, ABX_SANDBOX_BASE_URL="http://127.0.0.1:9", ABX_SANDBOX_API_KEY="k")
    assert seen == {"import": [], "step": []}


def test_the_probe_sees_engine_modules_when_they_are_loaded() -> None:
    # The same probe lists them once the local engine's provider module is imported.
    seen = _probe("import agent_sandbox.providers.local")
    assert seen["import"] == [] and "agent_sandbox.backends.runc.backend" in seen["step"]
