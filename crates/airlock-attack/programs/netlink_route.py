"""Dumps the network interfaces over an AF_NETLINK route socket (host topology disclosure).

usage: netlink_route.py
"""
import socket
import struct

from _common import blocked, done, errname, escaped

RTM_GETLINK, NLM_F_REQUEST, NLM_F_DUMP, IFLA_IFNAME, NLMSG_DONE = 18, 1, 0x300, 3, 3
names = []
try:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        body = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
        s.send(struct.pack("=IHHII", 16 + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        finished = False
        while not finished:
            data = s.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == NLMSG_DONE or length < 16:
                    finished = True
                    break
                attr = offset + 16 + 16
                while attr + 4 <= offset + length:
                    alen, atype = struct.unpack_from("=HH", data, attr)
                    if alen < 4:
                        break
                    if atype == IFLA_IFNAME:
                        names.append(data[attr + 4 : attr + alen].rstrip(b"\0").decode())
                    attr += (alen + 3) & ~3
                offset += (length + 3) & ~3
    escaped(f"interfaces: {' '.join(names)}")
except OSError as e:
    blocked(f"netlink route socket: {errname(e.errno)}")
done()
