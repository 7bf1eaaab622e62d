/*
 * fresh_isolation: the kernel work every zygote run must have done for it, and nothing else,
 * as the floor under `airlock-zygote throughput`. No interpreter, no program, no mounts, no
 * filters, no report: only what "fresh namespaces and a cgroup of its own, for each run"
 * costs on this kernel.
 *
 *   fresh_isolation CALLERS SECONDS MAX_RUNS [no-net]
 *
 * CALLERS processes loop for SECONDS (at most MAX_RUNS runs in all). A run: a cgroup in the
 * memory, pids, cpu, cpuacct and freezer v1 hierarchies, with memory (+swap), pids and CPU
 * limits written; a process cloned into new user, mount, PID, network, IPC and UTS namespaces
 * (without the network namespace under `no-net`), which joins the cgroup by writing 0 to
 * its `tasks` files (as the zygote's PID 1 does: no global lock), unshares its cgroup
 * namespace and exits; the caller reaps it and removes the cgroup. Prints one line:
 * `RUNS SECONDS CPU_SECONDS` (`run_callers`, floor.h). The network namespace's teardown runs in a kernel worker, on the same
 * CPUs, and so counts as it does for the zygote.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

static int tasks[COUNT];

static int run_child(void *unused) {
    (void)unused;
    for (int i = 0; i < COUNT; i++)
        if (write(tasks[i], "0", 1) != 1) return 1;
    return unshare(CLONE_NEWCGROUP) ? 1 : 0;
}

static int flags; /* the namespaces a run clones into */

static void one_run(int caller, long run) {
    static char stack[1 << 16];
    char dirs[COUNT][256];
    make_run_cgroup(dirs, tasks, "fresh", caller, run);
    pid_t child = clone(run_child, stack + sizeof stack, flags | SIGCHLD, NULL);
    if (child < 0) fail("clone");
    for (int i = 0; i < COUNT; i++) close(tasks[i]);
    int status;
    while (waitpid(child, &status, 0) < 0) {}
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("the run's child failed");
    for (int i = 0; i < COUNT; i++)
        while (rmdir(dirs[i])) usleep(100);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: fresh_isolation CALLERS SECONDS MAX_RUNS [no-net]\n");
        return 125;
    }
    int callers = atoi(argv[1]);
    double seconds = atof(argv[2]);
    long max_runs = atol(argv[3]);
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
    if (argc < 5 || strcmp(argv[4], "no-net")) flags |= CLONE_NEWNET;
    return run_callers(callers, seconds, max_runs, one_run);
}
