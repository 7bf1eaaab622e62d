"""Plants a symlink to a host file inside the writable workdir and reads through it.

usage: symlink_own.py TARGET
"""
import os
import sys

from _common import blocked, done, errname, escaped

target = sys.argv[1]
link = os.path.join(os.getcwd(), "innocent-looking-link")
try:
    os.symlink(target, link)
    with open(link, "rb") as f:
        escaped(f"read through {link} -> {target}: {f.read(4096).decode(errors='replace')!r}")
except OSError as e:
    blocked(f"{link} -> {target}: {errname(e.errno)}")
done()
