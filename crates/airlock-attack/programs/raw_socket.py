"""Forges a UDP packet on a raw IP socket (needs CAP_NET_RAW) to a listener on the host.

usage: raw_socket.py HOST PORT MARKER
"""
import socket
import struct
import sys

from _common import blocked, done, errname, escaped

host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
payload = marker.encode()
try:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP) as s:
        header = struct.pack(">HHHH", 40000, port, 8 + len(payload), 0)
        s.sendto(header + payload, (host, 0))
    escaped(f"forged udp packet to {host}:{port}")
except OSError as e:
    blocked(f"raw socket: {errname(e.errno)}")
done()
