"""A real wheel made offline inside a sandbox, for tests that pip-install a new package."""

from __future__ import annotations

_SCRIPT = """
import base64, hashlib, zipfile
dist = "NAME-1.0.dist-info/"
files = {"NAME.py": b"X = 42\\n",
         dist + "METADATA": b"Metadata-Version: 2.1\\nName: NAME\\nVersion: 1.0\\n",
         dist + "WHEEL": b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
def digest(data):
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + raw.decode()
record = "".join(f"{n},{digest(d)},{len(d)}\\n" for n, d in files.items())
with zipfile.ZipFile("WHEEL_FILE", "w") as whl:
    for name, data in files.items():
        whl.writestr(name, data)
    whl.writestr(dist + "RECORD", record + dist + "RECORD,,\\n")
"""


def wheel_file(name: str) -> str:
    return f"{name}-1.0-py3-none-any.whl"


def wheel_script(name: str, folder: str = "") -> str:
    """Python source that writes the wheel ``folder + wheel_file(name)`` (the module
    ``name`` with ``X = 42``) with the standard library alone: no index needed."""
    return _SCRIPT.replace("WHEEL_FILE", folder + wheel_file(name)).replace("NAME", name)
