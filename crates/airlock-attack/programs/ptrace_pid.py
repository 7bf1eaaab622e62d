"""Attaches to a process with ptrace and holds it stopped for a moment: a host process (the
harness watches TracerPid in the victim's /proc status from the host), or with `parent` the
process that started it (the sandbox's PID 1 or airlock's init, which hold pipes to the host).

usage: ptrace_pid.py PID|parent
"""
import os
import sys
import time

from _common import blocked, done, errname, escaped, syscall

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
pid = os.getppid() if sys.argv[1] == "parent" else int(sys.argv[1])
result, err = syscall("ptrace", PTRACE_ATTACH, pid, 0, 0)
if result < 0:
    blocked(f"ptrace(PTRACE_ATTACH, {pid}): {errname(err)}")
    done()
try:
    os.waitpid(pid, os.__dict__.get("WALL", 0x40000000))
except OSError:
    pass
escaped(f"attached to {pid}")
time.sleep(1.5)
syscall("ptrace", PTRACE_DETACH, pid, 0, 0)
done()
