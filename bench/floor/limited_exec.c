/*
 * limited_exec: the least a wrapper must do to keep airlock's per-run promises around a
 * sandbox tool, with nothing else: no policy, no output capture, no accounting report, no
 * error handling beyond "fail". airlock-bench runs `bwrap` under it with the argv airlock's
 * bwrap backend builds, as the floor of what `airlock run --backend bwrap` could cost.
 *
 *   limited_exec RUN_DIR TOOL [ARGS...]
 *
 * Per run, as airlock does it as root: a cgroup in the memory, pids, cpu, cpuacct and
 * freezer v1 hierarchies with memory (+swap), pids and CPU limits; a private mount namespace
 * whose size- and inode-capped tmpfs mounts cover RUN_DIR/work, RUN_DIR/tmp and RUN_DIR/shm;
 * the child joins the cgroup, starts a session, lowers rlimits, drops to uid/gid 65534, sets
 * no_new_privs and executes TOOL; the parent waits for it and for the cgroup to empty, reads
 * the peak memory and CPU time, and removes the cgroup.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor.h"

static ssize_t get(const char *dir, const char *file, char *buffer, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path);
    ssize_t n = read(fd, buffer, size);
    close(fd);
    return n;
}

static void scratch(const char *run_dir, const char *name, const char *options) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)) fail(path);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: limited_exec RUN_DIR TOOL [ARGS...]\n");
        return 125;
    }
    char dirs[COUNT][256];
    for (int i = 0; i < COUNT; i++) {
        char parent[128];
        snprintf(parent, sizeof parent, "/sys/fs/cgroup/%s/airlock-floor", HIERARCHIES[i]);
        mkdir(parent, 0755);
        snprintf(dirs[i], sizeof dirs[i], "%s/run-%d", parent, getpid());
        if (mkdir(dirs[i], 0755)) fail(dirs[i]);
    }
    limit_run_cgroup(dirs);
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) fail("mount namespace");
    const char *capped = "size=268435456,nr_inodes=10000,mode=0777";
    scratch(argv[1], "work", capped);
    scratch(argv[1], "tmp", capped);
    scratch(argv[1], "shm", "size=67108864,nr_inodes=1024,mode=0777");
    pid_t child = fork();
    if (child < 0) fail("fork");
    if (child == 0) {
        for (int i = 0; i < COUNT; i++) put(dirs[i], "tasks", "0");
        setsid();
        struct rlimit files = {256, 256}, size = {64 << 20, 64 << 20};
        setrlimit(RLIMIT_NOFILE, &files);
        setrlimit(RLIMIT_FSIZE, &size);
        if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)) fail("uid drop");
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("no_new_privs");
        execv(argv[2], argv + 2);
        fail(argv[2]);
    }
    int status;
    while (waitpid(child, &status, 0) < 0) {}
    char buffer[4096];
    while (get(dirs[1], "cgroup.procs", buffer, sizeof buffer) > 0) usleep(100);
    get(dirs[0], "memory.max_usage_in_bytes", buffer, sizeof buffer);
    get(dirs[3], "cpuacct.usage", buffer, sizeof buffer);
    for (int i = 0; i < COUNT; i++)
        while (rmdir(dirs[i])) usleep(100);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
