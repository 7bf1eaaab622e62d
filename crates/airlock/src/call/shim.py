# airlock tool-call shim (run as `python3 -I -c <this file>`). Standard library only.
#
# Reads one JSON request on stdin: {"nonce", "module_dir", "target": "module:function", "args"}.
# Calls the function and writes exactly one line to the ORIGINAL stdout:
#     AIRLOCK-RESULT <nonce> <reply JSON>
# Before the tool is imported, fd 1 is pointed at stderr, so anything the tool (or a process
# it starts) prints goes to stderr and cannot be mistaken for the result. The private copy of
# stdout is close-on-exec, so child programs never get it, and forked copies of this process
# never write a reply (only the original pid does).
import importlib
import json
import os
import sys
import traceback

TRACEBACK_CHARS = 4000


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _describe(exc):
    try:
        return str(exc)
    except Exception:
        return "<unprintable %s>" % type(exc).__name__


def _resolve(target):
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError("target %r is not module:function" % target)
    obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError("%s is not callable" % target)
    return obj


def _invoke(function, args):
    if isinstance(args, dict):
        return function(**args)
    if isinstance(args, list):
        return function(*args)
    return function(args)


def _reply_for(request):
    try:
        function = _resolve(request["target"])
    except Exception as exc:
        return {"ok": False, "kind": "bad_tool",
                "message": "%s: %s" % (type(exc).__name__, _describe(exc))}
    try:
        value = _invoke(function, request["args"])
    except Exception as exc:
        return {"ok": False, "kind": "raised", "exception": type(exc).__name__,
                "message": _describe(exc),
                "traceback": traceback.format_exc()[-TRACEBACK_CHARS:]}
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return {"ok": False, "kind": "unserializable", "message": _describe(exc)}
    return {"ok": True, "result": value}


def _main():
    owner_pid = os.getpid()
    result_fd = os.dup(1)  # os.dup makes a non-inheritable (close-on-exec) descriptor
    os.dup2(2, 1)
    request = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.path.insert(0, request["module_dir"])
    nonce = request.pop("nonce")
    reply = _reply_for(request)
    if os.getpid() != owner_pid:
        os._exit(0)
    line = "AIRLOCK-RESULT %s %s\n" % (nonce, json.dumps(reply, allow_nan=False))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _write_all(result_fd, line.encode("utf-8"))
    # Skip interpreter shutdown: leftover tool threads or atexit hooks must not delay the end.
    os._exit(0)


_main()
