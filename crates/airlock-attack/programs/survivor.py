"""Double-forks a daemon into its own session, so it outlives the run; its command line
carries MARKER so the host can find it. Prints READY once the daemon runs; with --wait it
then sleeps until killed (the harness kills the supervisor at that point).

usage: survivor.py MARKER [--wait]
"""
import os
import sys
import time

marker = sys.argv[1]
read_end, write_end = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(read_end)
        os.write(write_end, b"up")
        os.close(write_end)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time\nwhile True: time.sleep(1)", f"survivor-{marker}"])
    os._exit(0)
os.close(write_end)
os.read(read_end, 2)
print("READY", flush=True)
if "--wait" in sys.argv:
    while True:
        time.sleep(1)
