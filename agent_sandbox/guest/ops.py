"""The guest protocol's operations: the one table of names the guest serves
(``server.Agent.ops``) and the host calls (``guestlink``). Standard library only, like
every module here: the guest imports it by plain name inside the sandbox."""

HELLO = "hello"  # the first frame on a TCP connection: the sandbox's token
PING = "ping"
# memory snapshots: close every connection and the listener, hold a placeholder at the
# listener's fd until a checkpoint's restore puts a new listener there (server.park)
PARK = "park"

# processes
EXEC = "exec"
OUTPUT = "output"
WAIT = "wait"
KILL = "kill"
STDIN = "stdin"
PS = "ps"
FREEZE = "freeze"
THAW = "thaw"

# terminals
PTY_CREATE = "pty_create"
PTY_ATTACH = "pty_attach"
PTY_KILL = "pty_kill"
PTY_LIST = "pty_list"

# files and directories
READ = "read"
WRITE = "write"
LIST = "list"
STAT = "stat"
EXISTS = "exists"
MKDIR = "mkdir"
REMOVE = "remove"
RENAME = "rename"
TAR_OUT = "tar_out"
TAR_IN = "tar_in"
WATCH = "watch"
LOCK = "lock"  # an explicit lock on a file (locks.py)
UNLOCK = "unlock"

# ports
PORT_CONNECT = "port_connect"
