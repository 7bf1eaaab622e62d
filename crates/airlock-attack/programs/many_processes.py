"""Holds COUNT sleeping children at once, to find whether any process cap stops it. Unlike
fork_bomb.py it is bounded, so it is safe to run where nothing may contain it.

usage: many_processes.py MARKER COUNT
"""
import os
import sys
import time

from _common import blocked, done, errname, escaped

count = int(sys.argv[2])
children = []
refused = None
for _ in range(count):
    try:
        pid = os.fork()
    except OSError as e:
        refused = e
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
if refused is None:
    escaped(f"{count} processes alive at once")
else:
    blocked(f"fork refused after {len(children)} children: {errname(refused.errno)}")
done()
