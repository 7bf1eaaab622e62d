"""Adds a key to a kernel keyring (keyrings are not namespaced: a channel between sandboxes
and a large kernel attack surface).

usage: keyctl.py MARKER
"""
import ctypes
import sys

from _common import blocked, done, errname, escaped, syscall

KEY_SPEC_PROCESS_KEYRING = -2
payload = b"secret"
serial, err = syscall("add_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(f"airlock-{sys.argv[1]}".encode()),
                      ctypes.c_char_p(payload), len(payload), KEY_SPEC_PROCESS_KEYRING)
if serial < 0:
    blocked(f"add_key: {errname(err)}")
else:
    escaped(f"key {serial} added")
done()
