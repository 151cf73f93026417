"""Every bound and timeout of the guest agent, in one place (stdlib only)."""

FINISHED_KEPT = 256  # finished processes kept (output, exit code) before the oldest go
MAX_OUTPUT_CAP = 64 << 20
# A command's output not yet sent to one streaming client: once that is half of
# SUB_BACKLOG the output waits for the client (the program blocks on its pipe), at most
# SUB_STALL without the client taking any; past SUB_BACKLOG the oldest is dropped.
SUB_BACKLOG = 1 << 20
SUB_STALL = 2.0
MAX_FILE_OFFSET = 1 << 62  # a read's offset and limit (a file is at most 2**63 - 1 bytes)
LIST_CAP = 10000
# A file's metadata (user.e2b.* xattrs): names and values together, bytes (core/bounds.py).
MAX_FILE_METADATA = 4096
LIST_JSON_CAP = 6 << 20  # stay under what the host reads in one frame (8 MiB)
# A request's timeout: far above any the host gives (a day for commands, a week for
# watches), far below what a lock's wait takes (threading.TIMEOUT_MAX, ~292 years).
MAX_TIMEOUT = 1e9
# One wait of poll() (a C int of milliseconds): longer deadlines wait in several.
MAX_POLL_WAIT = 3600.0
REQUEST_TIMEOUT = 60.0  # waiting for hello/request frames
STREAM_TIMEOUT = 300.0  # between upload/stdin frames
EXIT_DRAIN = 0.2  # after exit, keep streaming already-readable output at most this long
KILL_GRACE = 10.0  # after a timeout SIGKILL, give up waiting for the exit this much later
DEFAULT_ENV_DROP = ("ABX_GUEST_TOKEN",)
# File watching (watch_ops): concurrent watches, directories per recursive watch (each
# is a kernel inotify watch), events per frame, the poller's interval and entry budget,
# and the entries a newly made directory's scan reports (what inotify may have missed).
WATCH_ACTIVE_MAX = 16
WATCH_DIRS_MAX = 4096
WATCH_BATCH = 256
WATCH_POLL_INTERVAL = 0.2
WATCH_POLL_ENTRIES = 20000
WATCH_SCAN_EVENTS = 1000
PTY_LIVE_CAP = 64  # terminals running at once in one sandbox
PTY_FINISHED_KEPT = 32  # ended terminals kept (recent output, exit code) for late clients
PTY_VIEWERS_CAP = 16  # clients attached to one terminal at once
PTY_RING = 256 << 10  # recent output of a terminal replayed to a client that (re)attaches
PTY_BACKLOG = 1 << 20  # undelivered output per attached client before its oldest is dropped
PTY_STALL = 2.0  # a terminal's output waits this long for a slow client before dropping
# File locks (locks.py): a write waits at most LOCK_WAIT_DEFAULT for the path (a caller
# may give up to LOCK_WAIT_MAX); explicit locks live up to LOCK_TTL_MAX, at most
# LOCKS_PER_HOLDER for one holder (a session) and LOCKS_MAX in one sandbox; at most
# LOCK_WAITERS_MAX calls wait for a path at once (the rest are told "locked" at once).
LOCK_WAIT_DEFAULT = 3.0
LOCK_WAIT_MAX = 30.0
LOCK_TTL_MAX = 3600.0
LOCKS_PER_HOLDER = 64
LOCKS_MAX = 1024
LOCK_WAITERS_MAX = 256
RETRY_AFTER_MAX = 5  # seconds a "locked" answer asks a client to wait before retrying
