"""Lifts its own cgroup's memory and pids limits, then allocates past the original limit.

usage: cgroup_raise.py ALLOCATE_MIB
"""
import os
import sys

from _common import blocked, done, errname, escaped

allocate_mib = int(sys.argv[1])
raised = []
try:
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
except OSError as e:
    lines = []
    blocked(f"/proc/self/cgroup: {errname(e.errno)}")
for line in lines:
    _, controllers, path = line.split(":", 2)
    # memsw first: v1 refuses a memory limit above the memory+swap limit.
    knobs = (("memory", "memory.memsw.limit_in_bytes"), ("memory", "memory.limit_in_bytes"), ("pids", "pids.max"), ("", "memory.max"))
    for controller, knob in knobs:
        if controller and controller not in controllers.split(","):
            continue
        if not controller and (controllers or path == "/"):
            continue
        base = f"/sys/fs/cgroup/{controller}" if controller else "/sys/fs/cgroup/unified"
        target = os.path.join(base + path, knob)
        value = "max" if knob in ("pids.max", "memory.max") else "-1"
        try:
            with open(target, "w") as f:
                f.write(value)
            raised.append(target)
        except OSError as e:
            blocked(f"{target}: {errname(e.errno)}")
if not raised:
    blocked("no cgroup limit could be raised")
    done()
# Prove the raise worked: hold more memory than the run was given.
hold = [bytearray(1 << 20) for _ in range(allocate_mib)]
for block in hold:
    block[::4096] = b"x" * len(block[::4096])
escaped(f"raised {raised} and allocated {allocate_mib} MiB")
done()
