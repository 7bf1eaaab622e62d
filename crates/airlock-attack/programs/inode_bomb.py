"""Creates empty files in the working directory up to MAX_FILES.

usage: inode_bomb.py MAX_FILES
"""
import os
import sys

from _common import blocked, done, errname, escaped

maximum = int(sys.argv[1])
created = 0
try:
    for index in range(maximum):
        os.close(os.open(f"inode-{index}", os.O_CREAT | os.O_WRONLY, 0o600))
        created += 1
    escaped(f"created {created} files")
except OSError as e:
    blocked(f"stopped after {created} files: {errname(e.errno)}")
done()
