"""Creates a nested user namespace (full capabilities inside it) plus a mount namespace, then
mounts a tmpfs: the usual stepping stone to kernel bugs reachable only with capabilities.

usage: userns_mount.py MARKER
"""
import ctypes
import os
import sys

from _common import blocked, done, errname, escaped, libc, syscall

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
uid, gid = os.getuid(), os.getgid()
result, err = syscall("unshare", CLONE_NEWUSER | CLONE_NEWNS)
if result < 0:
    blocked(f"unshare(CLONE_NEWUSER|CLONE_NEWNS): {errname(err)}")
    done()
try:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
except OSError as e:
    blocked(f"id maps: {errname(e.errno)}")
    done()
target = os.getcwd().encode()
if libc.mount(b"airlock-" + sys.argv[1].encode(), target, b"tmpfs", ctypes.c_ulong(0), None) == 0:
    escaped(f"uid {os.getuid()} in a new user namespace mounted tmpfs on {target.decode()}")
else:
    blocked(f"mount in the new namespace: {errname(ctypes.get_errno())}")
done()
