"""Connects to a host Unix socket, by path or (with a leading @) in the abstract namespace.

usage: unix_connect.py PATH_OR_@NAME MARKER
"""
import socket
import sys

from _common import blocked, done, errname, escaped

address, marker = sys.argv[1], sys.argv[2]
target = "\0" + address[1:] if address.startswith("@") else address
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(target)
        s.sendall(marker.encode())
    escaped(f"sent to unix socket {address}")
except OSError as e:
    blocked(f"unix socket {address}: {errname(e.errno)}")
done()
