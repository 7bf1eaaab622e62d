"""Shared helpers of the attack programs: raw syscalls and the report convention.

An attack prints `ESCAPED <what>` on a line of its own when the forbidden thing worked and
`BLOCKED <why>` when it did not, then exits 0. The harness never trusts these lines alone where
host-side evidence exists (a file, a listener, a process); they are the evidence only for
kernel interfaces whose sole effect is inside the caller.
"""
import ctypes
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)

# x86_64 syscall numbers.
SYS = {
    "ptrace": 101, "mount": 165, "unshare": 272, "keyctl": 250, "add_key": 248, "bpf": 321,
    "perf_event_open": 298, "io_uring_setup": 425, "clone3": 435, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "shmget": 29, "shmat": 30, "mknod": 133,
}


def syscall(name, *args):
    """Calls a syscall by name; returns (result, errno)."""
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(SYS[name]), *c_args)
    return result, (ctypes.get_errno() if result < 0 else 0)


def errname(errno):
    return f"{os.strerror(errno)} (errno {errno})"


def escaped(what):
    print(f"ESCAPED {what}", flush=True)


def blocked(what):
    print(f"BLOCKED {what}", flush=True)


def done():
    sys.stdout.flush()
    sys.exit(0)
