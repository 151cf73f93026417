"""One watched directory (or tree) by polling: where inotify is missing (stdlib only).

Every ``interval`` seconds the tree is listed again (up to a budget of entries) and
compared with the last listing: new paths are creates, gone ones deletes, a path whose
inode turns up under another name a rename, a changed size or mtime a modify, a changed
mode or owner a chmod. Changes undone between two listings are not seen.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Dict, List, Optional, Tuple

    Event = Dict[str, Any]
    Entry = Tuple[int, int, bool, int, int, int, int, int]

if __package__:
    from .watch_inotify import overflow
else:  # imported by agent.py from the guest's directory
    from watch_inotify import overflow  # type: ignore[no-redef]


class Poller:
    name = "poll"

    def __init__(self, root: str, recursive: bool, max_entries: int,
                 interval: float) -> None:
        self.root = root
        self.recursive = recursive
        self.max_entries = max_entries
        self.interval = interval
        self.ended: Optional[str] = None
        self.notices: List[Event] = []
        self._limited = False
        snapshot = self._scan()
        if snapshot is None:
            raise FileNotFoundError(2, "No such file or directory", root)
        self.snapshot = snapshot

    def fileno(self) -> None:
        return None

    def close(self) -> None:
        self.snapshot = {}

    def _scan(self) -> Optional[Dict[str, Entry]]:
        out: Dict[str, Entry] = {}
        stack = [self.root]
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    children = list(it)
            except OSError:
                if directory == self.root:
                    return None
                continue
            for child in children:
                if len(out) >= self.max_entries:
                    if not self._limited:
                        self._limited = True
                        self.notices.append(overflow(
                            f"more than {self.max_entries} entries to poll: changes beyond "
                            "them are not seen"))
                    return out
                try:
                    st = child.stat(follow_symlinks=False)
                except OSError:
                    continue
                is_dir = stat.S_ISDIR(st.st_mode)
                out[child.path] = (st.st_dev, st.st_ino, is_dir, st.st_mtime_ns,
                                   st.st_size, st.st_mode, st.st_uid, st.st_gid)
                if is_dir and self.recursive:
                    stack.append(child.path)
        return out

    def read(self) -> List[Event]:
        new = self._scan()
        events = self.notices
        self.notices = []
        if new is None:
            self.ended = "the watched directory is gone"
            return events
        events.extend(diff(self.snapshot, new))
        self.snapshot = new
        return events


def diff(old: Dict[str, Entry], new: Dict[str, Entry]) -> List[Event]:
    """The events that turn listing ``old`` into listing ``new``."""
    gone = {p: e for p, e in old.items() if p not in new}
    came = {p: e for p, e in new.items() if p not in old}
    by_inode = {(e[0], e[1]): p for p, e in gone.items()}
    renames: List[Tuple[str, str, bool]] = []
    changed: List[Event] = []
    for path, entry in sorted(new.items()):
        before = old.get(path)
        if before is None:
            source = by_inode.get((entry[0], entry[1]))
            if source is not None and gone[source][2] == entry[2]:
                renames.append((source, path, entry[2]))
                del gone[source], came[path], by_inode[(entry[0], entry[1])]
            continue
        if before[:2] != entry[:2]:  # replaced by another file (an atomic save)
            source = by_inode.pop((entry[0], entry[1]), None)
            if source is not None:
                del gone[source]
                renames.append((source, path, entry[2]))
            else:
                changed.append({"type": "modify", "path": path, "dir": entry[2]})
        elif not entry[2] and before[3:5] != entry[3:5]:
            changed.append({"type": "modify", "path": path, "dir": False})
        elif before[5:] != entry[5:]:
            changed.append({"type": "chmod", "path": path, "dir": entry[2]})
    events: List[Event] = []
    moved_dirs = [(o, n) for o, n, is_dir in renames if is_dir]
    for old_path, path, is_dir in renames:
        if not any(old_path.startswith(o + "/") and path == n + old_path[len(o):]
                   for o, n in moved_dirs):  # inside a renamed directory: implied
            events.append({"type": "rename", "path": path, "old_path": old_path,
                           "dir": is_dir})
    events.extend({"type": "delete", "path": p, "dir": e[2]} for p, e in sorted(gone.items()))
    events.extend({"type": "create", "path": p, "dir": e[2]} for p, e in sorted(came.items()))
    events.extend(changed)
    return events
