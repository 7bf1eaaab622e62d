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
    # Runs the runner on empty code in the template, before any fork: what the interpreter
    # makes lazily on a first run (the runner's bytecode specialised, type attribute caches,
    # interned names, the environment's encoded keys) is then made once and shared, instead
    # of being written (a page of the template's heap copied) in every child. No user code
    # runs; what it leaves is the same for every child, as the preloads' import-time state is.
    # The process-ending steps of `finish` (atexit handlers, joining the threads) must run in
    # each child, not here: they are stubbed out meanwhile.
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
            run("pass", [], env)
    finally:
        atexit._run_exitfuncs = run_exitfuncs
        if threading is not None:
            threading._shutdown = shutdown
        if main_module is not None:
            sys.modules["__main__"] = main_module
