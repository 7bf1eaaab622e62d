"""Sets up an io_uring instance (its operations bypass seccomp's view of syscalls).

usage: io_uring.py
"""
import ctypes

from _common import blocked, done, errname, escaped, syscall

params = (ctypes.c_uint8 * 120)()
fd, err = syscall("io_uring_setup", 4, ctypes.byref(params))
if fd < 0:
    blocked(f"io_uring_setup: {errname(err)}")
else:
    escaped(f"io_uring fd {fd}")
done()
