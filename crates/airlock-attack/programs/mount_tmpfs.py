"""Mounts a tmpfs over a directory (a mount is the first step of most container escapes).

usage: mount_tmpfs.py TARGET_DIR MARKER
"""
import ctypes
import os
import sys

from _common import blocked, done, errname, escaped, libc

target, marker = sys.argv[1], sys.argv[2]
if not os.path.isdir(target):
    target = os.getcwd()
if libc.mount(b"airlock-" + marker.encode(), target.encode(), b"tmpfs", ctypes.c_ulong(0), None) == 0:
    escaped(f"mounted tmpfs on {target}")
else:
    blocked(f"mount tmpfs on {target}: {errname(ctypes.get_errno())}")
done()
