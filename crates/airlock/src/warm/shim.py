# The interpreter a warm pool starts ahead, inside the sandbox, after every confinement step
# (namespaces, root, cgroup, Landlock, seccomp, capabilities, uid): it imports the modules
# named in argv[1], says it is ready on stdout, then reads one request from stdin (an 8-byte
# little-endian length, then NUL-separated fields: the code, the number of arguments, the
# arguments, the environment as KEY=VALUE) and runs the code as `python3 -c` would, with the
# rest of stdin left to it. It imports nothing besides what it is told to preload (os and sys
# are imported by every interpreter's start), so the code finds sys.modules as under
# `python3 -c` plus the preloads. Each interpreter serves exactly one run.
import os
import sys

MARKER = b"\0airlock-warm-ready\0\n"


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
    os.write(1, MARKER)
    size = int.from_bytes(read_exact(8), "little")
    fields = [f.decode("utf-8", "surrogateescape") for f in read_exact(size).split(b"\0")]
    code, count = fields[0], int(fields[1])
    args, env = fields[2 : 2 + count], fields[2 + count :]
    os.environ.clear()
    os.environ.update(item.split("=", 1) for item in env)
    sys.argv = ["-c"] + args
    code = compile(code, "<string>", "exec")
    main_module = type(sys)("__main__")
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    try:
        exec(code, main_module.__dict__)
    except SystemExit as stop:
        status = stop.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    else:
        status = 0
    finish(main_module, status)


def finish(main_module, status):
    # What exit does that a program can observe (threads joined, atexit handlers, the
    # code's globals released so their files flush and close, streams flushed), without the
    # interpreter's teardown of every module, which costs milliseconds and shows nothing.
    import atexit
    import gc

    if "threading" in sys.modules:  # the code may have started threads: join them
        sys.modules["threading"]._shutdown()

    atexit._run_exitfuncs()
    main_module.__dict__.clear()
    gc.collect()
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = status or 120
    os._exit(status & 0xFF)


main()
