"""Looks for a secret in its own environment and in every ancestor's /proc/PID/environ.

usage: parent_env.py VARIABLE_NAME
"""
import os
import sys

from _common import blocked, done, errname, escaped

name = sys.argv[1].encode()
if os.environb.get(name):
    escaped(f"own environment: {os.environb[name].decode(errors='replace')}")
pid = os.getppid()
seen = set()
while pid > 0 and pid not in seen:
    seen.add(pid)
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(name + b"="):
                    escaped(f"environ of ancestor {pid}: {entry.decode(errors='replace')}")
    except OSError as e:
        blocked(f"/proc/{pid}/environ: {errname(e.errno)}")
    try:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
blocked("the secret is in neither the own environment nor any readable ancestor's")
done()
