/*
 * What the C floors (limited_exec.c, fresh_isolation.c) share: the v1 hierarchies a run's
 * cgroup is made in and the limits airlock writes there, and their error and file helpers.
 * Each floor is compiled on its own (`cc -O2 -o BIN FLOOR.c`); this header sits beside them.
 */
#ifndef AIRLOCK_FLOOR_H
#define AIRLOCK_FLOOR_H

#include <fcntl.h>
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

#endif
