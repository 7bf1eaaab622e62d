"""Opens a perf event on itself (side channels, a large kernel attack surface).

usage: perf_event.py
"""
import ctypes

from _common import blocked, done, errname, escaped, syscall

PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
attr = (ctypes.c_uint8 * 128)()
ctypes.c_uint32.from_buffer(attr, 0).value = PERF_TYPE_SOFTWARE
ctypes.c_uint32.from_buffer(attr, 4).value = 128
ctypes.c_uint64.from_buffer(attr, 8).value = PERF_COUNT_SW_CPU_CLOCK
ctypes.c_uint64.from_buffer(attr, 40).value = (1 << 5) | (1 << 6)  # exclude_kernel, exclude_hv
fd, err = syscall("perf_event_open", ctypes.byref(attr), 0, -1, -1, 0)
if fd < 0:
    blocked(f"perf_event_open: {errname(err)}")
else:
    escaped(f"perf event fd {fd}")
done()
