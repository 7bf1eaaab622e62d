"""Sends a UDP datagram with a marker to a listener on the host's loopback.

usage: udp_send.py HOST PORT MARKER
"""
import socket
import sys

from _common import blocked, done, errname, escaped

host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(3):
            s.sendto(marker.encode(), (host, port))
    escaped(f"sent to udp {host}:{port}")
except OSError as e:
    blocked(f"udp {host}:{port}: {errname(e.errno)}")
done()
