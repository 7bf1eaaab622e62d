/*
 * What the C floors (limited_exec.c, fresh_isolation.c, prepared_isolation.c) share: the v1 hierarchies a run's
 * cgroup is made in and the limits airlock writes there, and their error and file helpers.
 * Each floor is compiled on its own (`cc -O2 -o BIN FLOOR.c`); this header sits beside them.
 */
#ifndef AIRLOCK_FLOOR_H
#define AIRLOCK_FLOOR_H

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *HIERARCHIES[] = {"memory", "pids", "cpu", "cpuacct", "freezer"};
enum { COUNT = sizeof HIERARCHIES / sizeof *HIERARCHIES };

static void fail(const char *what) {
    perror(what);
    exit(125);
}

static void put(const char *dir, const char *file, const char *value) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, value, strlen(value)) < 0) fail(path);
    close(fd);
}

/* A run cgroup's limits, one directory per hierarchy in HIERARCHIES' order: memory (and
 * memory + swap) 512 MiB, 64 pids, one CPU; the same in every floor. */
static void limit_run_cgroup(char dirs[COUNT][256]) {
    put(dirs[0], "memory.limit_in_bytes", "536870912");
    put(dirs[0], "memory.memsw.limit_in_bytes", "536870912");
    put(dirs[1], "pids.max", "64");
    put(dirs[2], "cpu.cfs_quota_us", "100000");
}

/* A run's cgroup, `KIND-PARENT-CALLER-RUN` under `airlock-floor` in each hierarchy, made and
 * limited, with its `tasks` files opened into `tasks` (what a run's process writes to join). */
static inline void make_run_cgroup(char dirs[COUNT][256], int tasks[COUNT], const char *kind,
                                   int caller, long run) {
    for (int i = 0; i < COUNT; i++) {
        snprintf(dirs[i], 256, "/sys/fs/cgroup/%s/airlock-floor/%s-%d-%d-%ld", HIERARCHIES[i],
                 kind, getppid(), caller, run);
        if (mkdir(dirs[i], 0755)) fail(dirs[i]);
    }
    limit_run_cgroup(dirs);
    for (int i = 0; i < COUNT; i++) {
        char path[320];
        snprintf(path, sizeof path, "%.255s/tasks", dirs[i]);
        if ((tasks[i] = open(path, O_WRONLY | O_CLOEXEC)) < 0) fail(path);
    }
}

static inline double floor_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* A throughput floor's measurement: CALLERS processes each call `one_run(caller, run)` in a
 * loop for SECONDS (at most MAX_RUNS runs in all), under the `airlock-floor` parent cgroups;
 * then prints `RUNS SECONDS CPU_SECONDS` (the user and system time of every process reaped,
 * the callers and theirs) and returns the exit status (125 when a caller failed). */
static inline int run_callers(int callers, double seconds, long max_runs,
                              void (*one_run)(int caller, long run)) {
    for (int i = 0; i < COUNT; i++) {
        char parent[128];
        snprintf(parent, sizeof parent, "/sys/fs/cgroup/%s/airlock-floor", HIERARCHIES[i]);
        mkdir(parent, 0755);
    }
    long *done = mmap(NULL, sizeof(long) * callers, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (done == MAP_FAILED) fail("mmap");
    double started = floor_now();
    for (int c = 0; c < callers; c++) {
        pid_t caller = fork();
        if (caller < 0) fail("fork");
        if (caller == 0) {
            for (long run = 0; floor_now() - started < seconds && run < max_runs / callers; run++) {
                one_run(c, run);
                done[c] = run + 1;
            }
            _exit(0);
        }
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    double took = floor_now() - started;
    long runs = 0;
    for (int c = 0; c < callers; c++) runs += done[c];
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    printf("%ld %.3f %.4f\n", runs, took, cpu);
    return failed ? 125 : 0;
}

#endif
