# Runs one request's code in a confined zygote child, as `python3 -c` would: the environment
# and sys.argv replaced, generators seeded at import reseeded, a fresh __main__, exit handling
# and flushing as at interpreter exit (without the teardown of every module). Loaded by the
# template under a private name that it then removes from sys.modules.
import os
import sys


def run(code, args, env):
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c"] + list(args)
    reseed()
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        status = stop.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    else:
        status = 0
    return finish(main, status)


def reseed():
    # os.fork reseeds random's global generator (an at-fork hook); this also covers a
    # template whose preloads hold generators of their own.
    for name in ("random", "numpy.random"):
        module = sys.modules.get(name)
        if module is not None:
            module.seed()


def finish(main, status):
    import atexit
    import gc

    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    main.__dict__.clear()
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
    return status & 0xFF
