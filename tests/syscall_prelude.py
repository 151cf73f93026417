"""The python prelude hostile tests run inside a sandbox (embedded engine or Pod): raw
syscalls and ptrace reporting -errno, and ``opened`` (0 or -errno)."""

PRELUDE = """
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
def sc(*args):
    r = libc.syscall(*args)
    return r if r >= 0 else -ctypes.get_errno()
def pt(req, pid):
    r = libc.ptrace(req, pid, None, None)
    return r if r >= 0 else -ctypes.get_errno()
def opened(path, flags=os.O_RDONLY):
    try:
        os.close(os.open(path, flags)); return 0
    except OSError as e:
        return -e.errno
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206
"""
