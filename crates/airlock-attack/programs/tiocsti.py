"""Pushes a command into the terminal on stdin with TIOCSTI, so the host shell would run it
after the sandbox exits.

usage: tiocsti.py TEXT
"""
import fcntl
import sys
import termios

from _common import blocked, done, errname, escaped

text = sys.argv[1] + "\n"
try:
    for char in text:
        fcntl.ioctl(0, termios.TIOCSTI, char.encode())
    escaped(f"injected {text!r}")
except OSError as e:
    blocked(f"ioctl(0, TIOCSTI): {errname(e.errno)}")
done()
