"""Allocates and touches memory in 16 MiB steps up to TARGET_MIB.

usage: memory_bomb.py TARGET_MIB
"""
import sys

from _common import done, escaped

target = int(sys.argv[1])
held = []
for step in range(target // 16):
    block = bytearray(16 << 20)
    block[::4096] = b"x" * len(block[::4096])
    held.append(block)
    print(f"holding {(step + 1) * 16} MiB", flush=True)
escaped(f"allocated all {target} MiB")
done()
