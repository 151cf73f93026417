"""In-sandbox guest agent and its wire protocol (stdlib only).

Inside a sandbox its modules import each other by plain name; on the host this package
is imported only for its protocol and for ``SOURCE_DIR``, the directory every sandbox
gets (read-only) as ``/.abx/guest``."""

from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
