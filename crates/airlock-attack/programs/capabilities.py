"""Reports the privilege it was left with: any effective capability, or no_new_privs off (a
setuid binary could then raise privileges).

usage: capabilities.py
"""
from _common import blocked, done, errname, escaped, libc

PR_GET_NO_NEW_PRIVS = 39

no_new_privs = libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
try:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    effective = int(fields["CapEff"].strip(), 16)
except OSError as e:
    effective = None
    blocked(f"/proc/self/status: {errname(e.errno)}")
except (KeyError, ValueError):
    effective = None
if effective:
    escaped(f"effective capabilities {effective:#x}")
if no_new_privs != 1:
    escaped("no_new_privs is off: setuid programs still raise privileges")
if not effective and no_new_privs == 1:
    blocked(f"no_new_privs set, effective capabilities {effective if effective is None else hex(effective)}")
done()
