"""Creates a user namespace with clone3, whose flags live in memory where a classic seccomp
filter cannot see them; the child reports its id map.

usage: clone3_userns.py
"""
import ctypes
import os

from _common import blocked, done, errname, escaped, syscall

CLONE_NEWUSER, SIGCHLD = 0x10000000, 17


class CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls")]


args = CloneArgs(flags=CLONE_NEWUSER, exit_signal=SIGCHLD)
read_end, write_end = os.pipe()
pid, err = syscall("clone3", ctypes.byref(args), ctypes.sizeof(args))
if pid == 0:
    try:
        with open("/proc/self/uid_map") as f:
            os.write(write_end, f.read().encode())
    finally:
        os._exit(0)
os.close(write_end)
if pid < 0:
    blocked(f"clone3(CLONE_NEWUSER): {errname(err)}")
else:
    os.waitpid(pid, 0)
    report = os.read(read_end, 4096).decode().strip()
    escaped(f"child {pid} in a new user namespace, uid_map {report!r}")
done()
