"""Creates an eBPF map (the entry point of many kernel exploits).

usage: bpf.py
"""
import ctypes

from _common import blocked, done, errname, escaped, syscall

BPF_MAP_CREATE, BPF_MAP_TYPE_ARRAY = 0, 2
attr = (ctypes.c_uint32 * 32)(BPF_MAP_TYPE_ARRAY, 4, 4, 1)
fd, err = syscall("bpf", BPF_MAP_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
if fd < 0:
    blocked(f"bpf(BPF_MAP_CREATE): {errname(err)}")
else:
    escaped(f"bpf map fd {fd}")
done()
