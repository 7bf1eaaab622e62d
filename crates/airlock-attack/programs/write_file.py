"""Writes outside the places the sandbox may write: a host directory, a read-only bind, a
sysctl in /proc/sys, a sysfs attribute, its own cgroup's limits.

usage: write_file.py PATH CONTENT
"""
import sys

from _common import blocked, done, errname, escaped

path, content = sys.argv[1], sys.argv[2]
try:
    with open(path, "w") as f:
        f.write(content)
    escaped(f"wrote {content!r} to {path}")
except OSError as e:
    blocked(f"{path}: {errname(e.errno)}")
done()
