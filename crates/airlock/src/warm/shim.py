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
    collector = __import__("gc")
    # Frozen uncollected: the imports' garbage is a little memory in a one-run process, and
    # a collection here would cost the preparation ~1 ms of CPU.
    collector.freeze()
    rehearse(lambda: run_as_main("pass"), 1)
    collector.freeze()
    for name in set(sys.modules) - preloaded:
        del sys.modules[name]


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
    os._exit(run_as_main(code))  # run_code.py, which comes first


main()
