"""Hardlinks a host file into a directory the program can write, then reads the link.
Path-based rules check the path used to open a file, so a hardlink can carry a file across them.

usage: hardlink.py TARGET LINK_PATH
"""
import os
import sys

from _common import blocked, done, errname, escaped

target, link = sys.argv[1], sys.argv[2]
try:
    os.link(target, link)
    with open(link, "rb") as f:
        escaped(f"read through hardlink {link}: {f.read(4096).decode(errors='replace')!r}")
except OSError as e:
    blocked(f"link {target} -> {link}: {errname(e.errno)}")
done()
