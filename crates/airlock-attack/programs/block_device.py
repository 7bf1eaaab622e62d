"""Reads the first sector of a host block device (the whole disk, past every permission).

usage: block_device.py DEVICE
"""
import hashlib
import sys

from _common import blocked, done, errname, escaped

device = sys.argv[1]
try:
    with open(device, "rb") as f:
        sector = f.read(512)
    escaped(f"read {device}: sha256 {hashlib.sha256(sector).hexdigest()}")
except OSError as e:
    blocked(f"{device}: {errname(e.errno)}")
done()
