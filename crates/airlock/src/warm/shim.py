# The interpreter a warm pool starts ahead, inside the sandbox, after every confinement step
# (namespaces, root, cgroup, Landlock, seccomp, capabilities, uid): it imports the modules
# named in argv[1], says it is ready on stdout, then reads one request from stdin (an 8-byte
# little-endian length and JSON: code, args, env) and runs the code as `python3 -c` would,
# with the rest of stdin left to it. Each interpreter serves exactly one run. Standard library
# only.
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
    import json

    request = json.loads(read_exact(int.from_bytes(read_exact(8), "little")))
    os.environ.clear()
    os.environ.update(dict(request["env"]))
    sys.argv = ["-c"] + request["args"]
    code = compile(request["code"], "<string>", "exec")
    main_module = type(sys)("__main__")
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    del globals()["main"]
    exec(code, main_module.__dict__)


main()
