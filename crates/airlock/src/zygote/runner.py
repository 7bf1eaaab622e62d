# Runs one request's code in a confined zygote child, as `python3 -c` would (run_code.py,
# whose text comes first): the environment and sys.argv replaced, generators seeded at import
# reseeded, then the code in a fresh __main__. The template loads this under a private name
# that it then removes from sys.modules.


def run(code, args, env):
    set_environment(env)
    sys.argv = ["-c"] + list(args)
    reseed()
    return run_as_main(code)


def set_environment(env):
    # The request's environment, changing only what differs from the one the child inherited
    # (the plan's, which warm_up set in the template): each variable written is a setenv and
    # an encoded key, pages of the template's heap copied in every child.
    wanted = dict(env)
    for key in [key for key in os.environ if key not in wanted]:
        del os.environ[key]
    for key, value in wanted.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def reseed():
    # The program was forked ahead of its request (CPython's after-fork work reseeded
    # random's global generator then, an at-fork hook); this reseeds at the request, from the kernel, and
    # also covers a template whose preloads hold generators of their own.
    for name in ("random", "numpy.random"):
        module = sys.modules.get(name)
        if module is not None:
            module.seed()


def warm_up(env, rounds=10):
    # Runs the runner on empty code in the template, before any fork (run_code.py's
    # rehearse): what a first run makes lazily (also the environment's encoded keys) is then
    # made once and shared, instead of being written (a page of the template's heap copied)
    # in every child. What it leaves is the same for every child, as the preloads'
    # import-time state is.
    rehearse(lambda: run("pass", [], env), rounds)
