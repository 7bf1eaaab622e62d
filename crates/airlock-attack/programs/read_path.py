"""Reads host paths the sandbox should not reach and prints what it got.

usage: read_path.py PATH...   (e.g. a canary in /root, /proc/1/root/..., /proc/PID/environ)
"""
import sys

from _common import blocked, done, errname, escaped

for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            data = f.read(65536)
        escaped(f"read {path}: {data.decode(errors='replace')!r}")
    except OSError as e:
        blocked(f"{path}: {errname(e.errno)}")
done()
