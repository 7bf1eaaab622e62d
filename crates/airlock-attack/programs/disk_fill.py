"""Fills the working directory with 1 MiB files up to MAX_MIB (stays under the file-size limit,
so only a disk quota can stop it).

usage: disk_fill.py MAX_MIB
"""
import os
import sys

from _common import blocked, done, errname, escaped

maximum = int(sys.argv[1])
chunk = b"\xa5" * (1 << 20)
written = 0
try:
    for index in range(maximum):
        with open(f"fill-{index}", "wb") as f:
            f.write(chunk)
        written += 1
    escaped(f"wrote {written} MiB")
except OSError as e:
    blocked(f"stopped after {written} MiB: {errname(e.errno)}")
done()
