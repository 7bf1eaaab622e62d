"""Attaches a System V shared memory segment a host process created, by its well-known key.

usage: sysv_shm.py KEY
"""
import ctypes
import sys

from _common import blocked, done, errname, escaped, libc

key = int(sys.argv[1])
libc.shmget.restype = ctypes.c_int
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
if shmid < 0:
    blocked(f"shmget({key}): {errname(ctypes.get_errno())}")
else:
    address = libc.shmat(ctypes.c_int(shmid), None, ctypes.c_int(0o10000))  # SHM_RDONLY
    if address in (None, ctypes.c_void_p(-1).value):
        blocked(f"shmat({shmid}): {errname(ctypes.get_errno())}")
    else:
        escaped(f"segment {shmid}: {ctypes.string_at(address, 64).rstrip(bytes(1)).decode(errors='replace')!r}")
done()
