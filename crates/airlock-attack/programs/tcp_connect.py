"""Connects to a TCP listener on the host's loopback and sends a marker.

usage: tcp_connect.py HOST PORT MARKER
"""
import socket
import sys

from _common import blocked, done, errname, escaped

host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    with socket.create_connection((host, port), timeout=3) as s:
        s.sendall(marker.encode())
    escaped(f"sent to tcp {host}:{port}")
except OSError as e:
    blocked(f"tcp {host}:{port}: {errname(e.errno) if e.errno else e}")
done()
