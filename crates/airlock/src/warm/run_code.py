# Running code as `python3 -c` would, in an interpreter started ahead of it: a fresh __main__,
# SystemExit and uncaught exceptions handled as at exit, then what exit does that a program
# can observe (threads joined, atexit handlers, the code's globals released so their files
# flush and close, streams flushed), without the interpreter's teardown of every module,
# which costs milliseconds and shows nothing; and a rehearsal of that on empty code before
# any request. Shared by the warm interpreter's shim and the zygote's runner: this text comes
# first in each.
import os
import sys


def run_as_main(code):
    main_module = type(sys)("__main__")
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    try:
        exec(compile(code, "<string>", "exec"), main_module.__dict__)
    except SystemExit as stop:
        status = stop.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    else:
        status = 0
    return finish(main_module, status)


def finish(main_module, status):
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
    return status & 0xFF


def rehearse(run_once, rounds):
    # Runs `run_once` (the runner on empty code) before any request: what the interpreter makes
    # lazily on a first run is then made ahead of it (the compiler's AST types, ~1-2 ms on the
    # first compile(); the runner's bytecode specialised, type attribute caches, interned
    # names). No user code runs. The process-ending steps of `finish` (atexit handlers,
    # joining the threads) must run for the request alone: they are stubbed out meanwhile.
    import atexit

    main_module = sys.modules.get("__main__")
    threading = sys.modules.get("threading")
    run_exitfuncs = atexit._run_exitfuncs
    shutdown = threading._shutdown if threading is not None else None
    atexit._run_exitfuncs = lambda: None
    if threading is not None:
        threading._shutdown = lambda: None
    try:
        for _ in range(rounds):
            run_once()
    finally:
        atexit._run_exitfuncs = run_exitfuncs
        if threading is not None:
            threading._shutdown = shutdown
        if main_module is not None:
            sys.modules["__main__"] = main_module
