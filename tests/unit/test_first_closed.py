"""The mode-bit walk both the data-dir check and the proxy's interpreter choice use."""

import os
import tempfile
from pathlib import Path

from agent_sandbox.backends.runc.host_paths import first_closed

NOBODY = 65534


def test_the_first_closed_directory_or_the_target_is_named() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's own tmp is 0700
        _walk(Path(top))


def _walk(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    inner = tmp_path / "private" / "lib"
    inner.mkdir(parents=True)
    os.chmod(inner, 0o755)
    want = os.R_OK | os.X_OK
    assert first_closed(str(inner), NOBODY, NOBODY, want) == ""
    os.chmod(tmp_path / "private", 0o700)  # a pyenv under /root
    assert first_closed(str(inner), NOBODY, NOBODY, want) == str(tmp_path / "private")
    os.chmod(tmp_path / "private", 0o711)  # enterable, the target not readable
    os.chmod(inner, 0o711)
    assert first_closed(str(inner), NOBODY, NOBODY, want) == str(inner)
    assert first_closed(str(inner), NOBODY, NOBODY, os.X_OK) == ""
    assert first_closed(str(tmp_path / "gone"), NOBODY, NOBODY, want) == str(tmp_path / "gone")
