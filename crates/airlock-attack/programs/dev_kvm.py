"""Opens /dev/kvm and talks to the hypervisor interface.

usage: dev_kvm.py
"""
import fcntl
import os

from _common import blocked, done, errname, escaped

KVM_GET_API_VERSION = 0xAE00
try:
    fd = os.open("/dev/kvm", os.O_RDWR)
    escaped(f"/dev/kvm open, KVM API version {fcntl.ioctl(fd, KVM_GET_API_VERSION)}")
except OSError as e:
    blocked(f"/dev/kvm: {errname(e.errno)}")
done()
