# Runs one request's code in a confined zygote child, as `python3 -c` would (run_code.py,
# whose text comes first): the environment and sys.argv replaced, generators seeded at import
# reseeded, then the code in a fresh __main__. The template loads this under a private name
# that it then removes from sys.modules.


def run(code, args, env):
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c"] + list(args)
    reseed()
    return run_as_main(code)


def reseed():
    # The program was forked ahead of its request (CPython's after-fork work reseeded
    # random's global generator then, an at-fork hook); this reseeds at the request, from the kernel, and
    # also covers a template whose preloads hold generators of their own.
    for name in ("random", "numpy.random"):
        module = sys.modules.get(name)
        if module is not None:
            module.seed()
