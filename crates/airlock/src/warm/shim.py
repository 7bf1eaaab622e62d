# The interpreter a warm pool starts ahead, inside the sandbox, after every confinement step
# (namespaces, root, cgroup, Landlock, seccomp, capabilities, uid): it imports the modules
# named in argv[1], does ahead what the run would otherwise pay for (prepare_for_run), says
# it is ready on stdout, then reads one request from stdin (an 8-byte little-endian length,
# then NUL-separated fields: the code, the number of arguments, the arguments, the
# environment as KEY=VALUE) and runs the code as `python3 -c` would, with the rest of stdin
# left to it (run_code.py, whose text comes first). It imports nothing besides what it is
# told to preload (os and sys are imported by every interpreter's start), so the code finds
# sys.modules as under `python3 -c` plus the preloads. Each interpreter serves exactly one
# run.

MARKER = b"\0airlock-warm-ready\0\n"


def prepare_for_run():
    # Work the run would otherwise pay for, done while the sandbox waits for it: the runner
    # rehearsed on empty code (the first compile() makes the compiler's AST types), and the
    # objects made so far moved to the collector's permanent generation, so that `finish`'s
    # collection walks only what the run made (a full one walks the preloads': ~1 ms for
    # json and re). The modules this imports (gc, atexit) leave sys.modules again; the
    # preloads' stay.
    preloaded = set(sys.modules)
    hold_address_space()
    collector = __import__("gc")
    # Frozen uncollected: the imports' garbage is a little memory in a one-run process, and
    # a collection here would cost the preparation ~1 ms of CPU.
    collector.freeze()
    rehearse(lambda: run_as_main("pass"), 1)
    collector.freeze()
    for name in set(sys.modules) - preloaded:
        del sys.modules[name]


# What keeps the holder's stack alive (it runs on it if a signal handler does).
HELD = []
HOLDER_STACK_BYTES = 1 << 16
CLONE_VM = 0x100
CLONE_FILES = 0x400


def hold_address_space():
    # A process sharing this interpreter's memory and descriptor table, asleep for good
    # (pause), so that this interpreter's exit is not its address space's last user: the
    # kernel then reports the exit to PID 1 at once instead of after tearing the address
    # space down (exit_mmap: 1-3 ms on the snippet's path), which happens when the sandbox
    # ends and the holder is killed with it. It runs nothing of its own: same user,
    # namespaces, cgroup, seccomp and Landlock as the interpreter, which could fork as much
    # itself. Its exit signal is 0, so the code's wait() calls do not see it. Without ctypes
    # or clone (refused), the run goes on without it, only slower.
    try:
        ctypes = __import__("ctypes")
        libc = ctypes.CDLL(None)
        stack = ctypes.create_string_buffer(HOLDER_STACK_BYTES)
        top = ctypes.c_void_p(ctypes.addressof(stack) + HOLDER_STACK_BYTES - 64)
        pause = ctypes.cast(libc.pause, ctypes.c_void_p)
        if libc.clone(pause, top, CLONE_VM | CLONE_FILES, None) > 0:
            HELD.append(stack)
    except Exception:
        pass


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(0)  # retired unused: nothing to run
        data += chunk
    return data


def main():
    for name in filter(None, sys.argv[1].split(",")):
        __import__(name)
    prepare_for_run()
    # Stopped until PID 1 has read the CPU this preparation used, which is not the run's
    # (init/prepared_cpu.rs). 19 is SIGSTOP on x86-64 and arm64; `signal` is not imported,
    # so that sys.modules stays what `python3 -c` has.
    os.kill(os.getpid(), 19)
    os.write(1, MARKER)
    size = int.from_bytes(read_exact(8), "little")
    fields = [f.decode("utf-8", "surrogateescape") for f in read_exact(size).split(b"\0")]
    code, count = fields[0], int(fields[1])
    args, env = fields[2 : 2 + count], fields[2 + count :]
    os.environ.clear()
    os.environ.update(item.split("=", 1) for item in env)
    sys.argv = ["-c"] + args
    status = run_as_main(code)  # run_code.py, which comes first
    # The holder shares the descriptor table: closed here (after finish's flush), the pipes
    # end now, as exit would have ended them.
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))
    os._exit(status)


main()
