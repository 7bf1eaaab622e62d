# Running code as `python3 -c` would, in an interpreter started ahead of it: a fresh __main__,
# SystemExit and uncaught exceptions handled as at exit, then what exit does that a program
# can observe (threads joined, atexit handlers, the code's globals released so their files
# flush and close, streams flushed), without the interpreter's teardown of every module,
# which costs milliseconds and shows nothing. Shared by the warm interpreter's shim and the
# zygote's runner: this text comes first in each.
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
