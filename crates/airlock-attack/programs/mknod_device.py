"""Makes its own device node for physical memory (char 1:1, what /dev/mem is) and opens it:
device nodes bypass every path rule on the files behind them.

usage: mknod_device.py DIR
"""
import os
import stat
import sys

from _common import blocked, done, errname, escaped

directory = sys.argv[1] if os.path.isdir(sys.argv[1]) else os.getcwd()
node = os.path.join(directory, "mem")
try:
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 1))
except OSError as e:
    blocked(f"mknod {node} c 1 1: {errname(e.errno)}")
    done()
escaped(f"created the device node {node}")
try:
    with open(node, "rb", buffering=0) as f:
        escaped(f"read {len(f.read(16))} bytes of physical memory through {node}")
except OSError as e:
    print(f"note: the node exists but cannot be read here: {errname(e.errno)}")
done()
