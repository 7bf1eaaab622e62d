"""Helper for airlock workers (worker protocol v1). Standard library only; copy it anywhere.

A worker runs in a job directory laid out by the host:

    in/            declared input files (read-only)
    options.json   the job's options
    out/           where results go (the only writable place besides tmp)

and reports on stdout with one JSON object per line. Use ``progress``, ``log`` and ``done``
rather than ``print``: any other stdout line is reported to the caller as an error event.
Print free-form diagnostics to stderr instead.

The job directory is ``$AIRLOCK_JOB_DIR`` if set, else the current working directory.
See docs/worker-protocol.md.
"""

import json
import math
import os
import sys

PROTOCOL_VERSION = 1
MAX_NAME_BYTES = 255

__all__ = [
    "PROTOCOL_VERSION",
    "progress",
    "log",
    "done",
    "inputs",
    "options",
    "output_path",
    "job_dir",
]


def job_dir():
    """The job directory: $AIRLOCK_JOB_DIR, or the current working directory."""
    return os.environ.get("AIRLOCK_JOB_DIR") or os.getcwd()


def _emit(event):
    event = dict(event, v=PROTOCOL_VERSION)
    sys.stdout.write(json.dumps(event, allow_nan=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def progress(pct, msg=None):
    """Report that the job is ``pct`` (a number in 0..1) done, with an optional message."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)):
        raise TypeError("progress fraction must be a number, got %r" % (pct,))
    if not math.isfinite(pct) or not 0 <= pct <= 1:
        raise ValueError("progress fraction must be within 0..1, got %r" % (pct,))
    event = {"progress": float(pct)}
    if msg is not None:
        event["message"] = str(msg)
    _emit(event)


def log(msg):
    """Send a line of diagnostic text to the caller."""
    _emit({"log": str(msg)})


def done():
    """Declare the job finished: ``out/`` is complete. Exit with status 0 afterwards."""
    _emit({"done": True})


def inputs():
    """The staged inputs: a dict of file name -> path, sorted by name."""
    in_dir = os.path.join(job_dir(), "in")
    names = sorted(os.listdir(in_dir)) if os.path.isdir(in_dir) else []
    return {
        name: os.path.join(in_dir, name)
        for name in names
        if os.path.isfile(os.path.join(in_dir, name))
    }


def options():
    """The job's options, parsed from options.json."""
    with open(os.path.join(job_dir(), "options.json"), encoding="utf-8") as handle:
        return json.load(handle)


def name_problem(name):
    """Why ``name`` is not a valid single file name, or None. Mirrors the host's rule."""
    if not isinstance(name, str):
        return "name is not a string"
    if name == "":
        return "name is empty"
    if name in (".", ".."):
        return "name is a directory reference"
    if "/" in name:
        return "name contains '/'"
    if "\0" in name:
        return "name contains a NUL byte"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return "name contains a control character"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if len(encoded) > MAX_NAME_BYTES:
        return "name is too long"
    return None


def output_path(name):
    """Path of ``out/<name>``; ``name`` must be a single plain file name (no '/', no '..')."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError("invalid output name %r: %s" % (name, problem))
    return os.path.join(job_dir(), "out", name)
