"""The seccomp policy every sandbox runs under, as an OCI ``linux.seccomp`` section.

Allow by default, deny what lets a process reach beyond its sandbox or the kernel's
soft underbelly: mounting, module loading, kexec, bpf, keyrings, perf, namespace
creation, io_uring and the clock. ``clone3`` answers ENOSYS so libc falls back to
``clone``, whose flags seccomp can inspect.
"""

from __future__ import annotations

from typing import Any

_EPERM = 1
_ENOSYS = 38
_CLONE_NEWUSER = 0x10000000

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
    # cross-process memory access is not needed by ordinary tools
    "kcmp", "process_madvise",
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
        ],
    }
