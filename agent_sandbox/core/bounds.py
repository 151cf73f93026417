"""Every bound an input of a sandbox may reach, named once.

The service checks them, the guest keeps the ones it enforces itself as equal literals
(stdlib only; tests/server/test_schema_bounds.py holds both at each bound), and every
surface states them in its schema: the REST and E2B APIs, the MCP tools, the CLI.
"""

from __future__ import annotations

# A sandbox.
MAX_SANDBOX_TIMEOUT = 30 * 86400  # idle seconds before it is paused (or killed), 30 days
MAX_LIFETIME = 365 * 86400  # seconds from create to its end, a year
MIN_MEMORY_MB, MAX_MEMORY_MB = 32, 1 << 20
MIN_DISK_MB, MAX_DISK_MB = 16, 1 << 22
# The kernel refuses a CPU quota under 1 ms per 100 ms period: the sandbox would not start.
MIN_CPU = 0.01
MAX_CPU_ANY = 1024  # what a schema states; the service holds a create to its backend's CPUs

# Calls into a sandbox.
MAX_COMMAND_TIMEOUT = 86400  # run, wait and run_code: at most a day
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT; the guest's bound
MIN_SIGNAL, MAX_SIGNAL = 1, 64  # the guest's bound
MAX_FILE_OFFSET = 1 << 62  # the guest's bound on a read's offset and limit
MAX_MODE = 0o7777  # permission bits of a file written
MAX_DEPTH = 64  # list_files
# A file's metadata (E2B's: user xattrs named user.e2b.<key>): its names (with the prefix)
# and values together, in bytes, as envd bounds it (one ext4 block); the guest's equal.
MAX_FILE_METADATA = 4096
# File locks (the guest's, equal literals in guest/limits.py): a write waits for its turn
# at most lock_wait seconds (default 3); an explicit lock lives ttl seconds.
LOCK_WAIT_DEFAULT = 3.0
MAX_LOCK_WAIT = 30.0
MAX_LOCK_TTL = 3600.0
MAX_VERSION = 100  # characters of a file version (if_match)
MAX_LOCK_TOKEN = 64

# Paths: the service takes up to 4096 characters and leaves the rest to the kernel. The
# gateway states the kernel's limits too, in characters as JSON Schema counts them:
# PATH_MAX less its NUL, NAME_MAX a name.
MAX_PATH_INPUT = 4096
MAX_PATH = 4095
MAX_NAME = 255

# Network policies.
MAX_NETWORK_ENTRIES = 256  # on allow_out and deny_out
MAX_NETWORK_ENTRY = 253  # a host name's longest spelling (a CIDR is shorter)
MAX_NETWORK_TEXT = MAX_NETWORK_ENTRIES * (MAX_NETWORK_ENTRY + 2)  # a comma list of them
