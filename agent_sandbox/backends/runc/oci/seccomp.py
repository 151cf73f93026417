"""The seccomp policy every sandbox runs under, as an OCI ``linux.seccomp`` section.

Allow by default, deny what lets a process reach beyond its sandbox or the kernel's
soft underbelly: mounting, module loading, kexec, bpf, keyrings, perf, namespace
creation, io_uring and the clock. ``clone3`` answers ENOSYS so libc falls back to
``clone``, whose flags seccomp can inspect. ``ptrace`` stays allowed for debugging inside
the sandbox, except against pid 1 (the guest agent). AF_VSOCK sockets are refused: vsock
is not confined by the network namespace.
"""

from __future__ import annotations

from typing import Any

_EPERM = 1
_ENOSYS = 38
_CLONE_NEWUSER = 0x10000000
_AF_VSOCK = 40
# The sandbox's pid 1 is the guest agent: it holds the host's end of the sandbox (its
# socket, its log), so no process in the sandbox may trace or poke it.
_GUEST_PID = 1
# pid and domain arguments are 32-bit ints the kernel truncates, while seccomp sees all 64
# bits of the register: compare the low half only, or garbage high bits slip past.
_LOW32 = 0xFFFFFFFF


def _arg_is(index: int, value: int) -> dict[str, Any]:
    return {"index": index, "value": _LOW32, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


DENIED_SYSCALLS: tuple[str, ...] = (
    # filesystems and mounts
    "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
    "fspick", "open_tree", "move_mount", "mount_setattr", "quotactl", "quotactl_fd",
    "name_to_handle_at", "open_by_handle_at", "swapon", "swapoff",
    # kernel code and the machine
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "create_module", "get_kernel_syms", "query_module", "uselib", "iopl",
    "ioperm", "syslog", "acct", "lookup_dcookie", "nfsservctl", "vm86", "vm86old",
    # bpf, perf, keyrings, userfaultfd, io_uring: large attack surface
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # namespaces: a sandbox does not nest sandboxes
    "unshare", "setns",
    # time is the host's
    "settimeofday", "stime", "clock_settime", "clock_settime64", "clock_adjtime",
    "clock_adjtime64", "adjtimex",
    # cross-process memory access is not needed by ordinary tools; pidfd_getfd would let
    # any process take the guest's descriptors (its stdout is a file on the host's disk)
    "kcmp", "process_madvise", "pidfd_getfd",
)


def seccomp_profile() -> dict[str, Any]:
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32",
                          "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS},
            {
                # clone(flags, ...) with CLONE_NEWUSER set: refused.
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": _EPERM,
                "args": [{"index": 0, "value": _CLONE_NEWUSER, "valueTwo": _CLONE_NEWUSER,
                          "op": "SCMP_CMP_MASKED_EQ"}],
            },
            {
                # ptrace(request, pid, ...) aimed at the guest agent.
                "names": ["ptrace"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": _EPERM,
                "args": [_arg_is(1, _GUEST_PID)],
            },
            {
                # process_vm_{read,write}v(pid, ...) of the guest.
                "names": ["process_vm_readv", "process_vm_writev"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": _EPERM,
                "args": [_arg_is(0, _GUEST_PID)],
            },
            {
                # socket(AF_VSOCK, ...): reaches the host kernel past the netns.
                "names": ["socket"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": _EPERM,
                "args": [_arg_is(0, _AF_VSOCK)],
            },
        ],
    }
