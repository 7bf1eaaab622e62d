"""Writes into the host kernel log through /dev/kmsg (log forging, log flooding).

usage: kmsg_write.py MARKER
"""
import sys

from _common import blocked, done, errname, escaped

try:
    with open("/dev/kmsg", "w") as f:
        f.write(f"airlock attack {sys.argv[1]}\n")
    escaped("wrote to /dev/kmsg")
except OSError as e:
    blocked(f"/dev/kmsg: {errname(e.errno)}")
done()
