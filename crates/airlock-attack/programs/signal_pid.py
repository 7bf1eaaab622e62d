"""Sends SIGKILL to a host process.

usage: signal_pid.py PID
"""
import os
import signal
import sys

from _common import blocked, done, errname, escaped

pid = int(sys.argv[1])
try:
    os.kill(pid, signal.SIGKILL)
    escaped(f"sent SIGKILL to {pid}")
except OSError as e:
    blocked(f"kill({pid}): {errname(e.errno)}")
done()
