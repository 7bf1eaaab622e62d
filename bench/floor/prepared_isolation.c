/*
 * prepared_isolation: the kernel work one run of a prepared sandbox (`WarmPool`, profile
 * `untrusted`, `/bin/true`) needs with airlock's guarantees, and nothing else, as the floor
 * under `warm-throughput`. A prepared sandbox is consumed by its run: its whole life (made,
 * confined, used once, torn down) is a run's cost, so that is what one run here does. No
 * supervisor, no pipes, no report, no spec, no policy: only the kernel's side.
 *
 *   prepared_isolation CALLERS SECONDS MAX_RUNS MODE [SECCOMP_DIR]
 *
 * CALLERS processes loop for SECONDS (at most MAX_RUNS runs in all). MODE, each adding to the
 * one before:
 *
 *   ns       a cgroup in the memory, pids, cpu, cpuacct and freezer v1 hierarchies with the
 *            run's limits; a process that joins it (`tasks`, as airlock's child does), takes
 *            its rlimits and a session of its own, drops root to 65534 and starts PID 1 in new
 *            user, mount, PID, network, IPC and UTS namespaces; PID 1 maps its own uid and gid
 *            (as airlock's child does: setgroups deny, one id each) and unshares its cgroup
 *            namespace. The caller reaps it and removes the cgroup.
 *   root     + the root airlock's native backend builds for `untrusted` with a tmpfs workdir
 *            (`confine/rootfs/plan.rs`, `plan_operations`), built from scratch the same way
 *            (`execute.rs`): mounts private; a tmpfs root over `/dev/shm`; its skeleton and the
 *            four generated `/etc` files; `/usr`, `/lib*`, `/bin`, `/sbin` and the `/etc`
 *            entries bound read-only where they are directories or files on the host (symlinks
 *            made again); the five `/dev` nodes bound and the four `/dev` links; a `/dev/shm`
 *            tmpfs; `/proc` (`hidepid=invisible`) with its read-only binds, `/dev/null` over the
 *            masked files and the root's own `/proc` mount point cloned over masked directories
 *            (`open_tree`, `mount_setattr`, `move_mount`); a `/tmp` tmpfs and a tmpfs workdir;
 *            `pivot_root(".", ".")` and a detach; `/` sealed read-only; chdir to the workdir.
 *   confine  + the hostname, PID 1's parent-death signal, Landlock (ABI 6 rights: the same
 *            paths and access as `native.rs`'s `landlock_rules`, TCP denied, IPC scoped),
 *            no_new_privs, every capability dropped, and airlock's own two seccomp filters
 *            (SECCOMP_DIR/table.bpf and arguments-unix.bpf, the images airlock installs).
 *   program  + `/bin/true` started sharing PID 1's memory until its exec
 *            (`CLONE_VM | CLONE_VFORK`, as airlock's PID 1 does), with a scrubbed environment,
 *            and reaped.
 *   show     `program` with a shell that prints the mount table, the ids, capabilities,
 *            no_new_privs and seccomp lines of its status, the hostname and its directory,
 *            to compare with `airlock run --warm -- sh -c ...` (`prepared_isolation 1 1 1 show
 *            DIR`).
 *
 * Left out (not kernel work the isolation needs, or chosen differently by airlock): the
 * supervisor, init and spawner processes and their pipes, the host run directory, resolving
 * the sources (done once here, per sandbox in airlock), the checks that a path did not change
 * under the bind, the read of `/proc/thread-self/status` that checks the capabilities are
 * gone, Landlock's fallback to an older ABI (this floor needs ABI 6), PID 1's report and its
 * wait for a quiet namespace.
 *
 * Prints one line: `RUNS SECONDS CPU_SECONDS`, the last being the user and system time of
 * every process the callers reaped (the kernel's workers that tear namespaces down, such as
 * `cleanup_net`, run on the same CPUs and so weigh on the rate, but are not in that figure, as
 * they are not in `warm-throughput`'s either).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

/* The newer calls' numbers (the same on every architecture) where the headers predate them. */
#ifndef SYS_open_tree
#define SYS_open_tree 428
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

enum mode { NS, ROOT, CONFINE, PROGRAM };

/* The sandbox user, the uid and gid `untrusted` drops root to. */
#define SANDBOX_ID 65534
#define NEW_ROOT "/dev/shm"
#define WORKDIR "/run/airlock/run-floor/work"

/* mount_setattr(2)'s attributes and flags, from linux/mount.h (not every libc has them). */
#define ATTR_RDONLY 0x1ULL
#define ATTR_NOSUID 0x2ULL
#define ATTR_NODEV 0x4ULL
#define ATTR_NOEXEC 0x8ULL
#define SEALED (ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC)
#define TREE_CLONE 1U          /* OPEN_TREE_CLONE */
#define MOVE_F_EMPTY_PATH 0x4U /* MOVE_MOUNT_F_EMPTY_PATH */

struct attrs {
    uint64_t set, clr, propagation, userns_fd;
};

/* Landlock's ABI 6, as `confine/landlock.rs` asks for it (the header here may be older). */
struct ruleset_attr {
    uint64_t fs, net, scoped;
};
struct path_beneath {
    uint64_t allowed;
    int32_t parent_fd;
} __attribute__((packed));
#define LL_EXECUTE (1ULL << 0)
#define LL_WRITE_FILE (1ULL << 1)
#define LL_READ_FILE (1ULL << 2)
#define LL_READ_DIR (1ULL << 3)
#define LL_TRUNCATE (1ULL << 14)
#define LL_IOCTL_DEV (1ULL << 15)
#define LL_FS_ALL ((1ULL << 16) - 1)
#define LL_FILE_RIGHTS (LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV)

/* What a run does, fixed before the first: the host's sources (kinds and symlink targets),
 * the seccomp images, the Landlock ABI. */
enum kind { ABSENT, DIRECTORY, FILE_, SYMLINK };
struct source {
    char path[64];
    enum kind kind;
    char target[256];
};
static const char *SYSTEM_RO[] = {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"};
static const char *ETC_FIXED[] = {
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "localtime", "timezone", "nsswitch.conf", "host.conf",
    "gai.conf", "protocols", "services", "mime.types", "terminfo", "perl"};
static struct source sources[64];
static int source_count;

static struct sock_fprog filters[2];
static int landlock_abi;
static enum mode mode;
static int tasks[COUNT];

static void note_source(const char *path) {
    struct source *s = &sources[source_count++];
    snprintf(s->path, sizeof s->path, "%s", path);
    struct stat st;
    if (lstat(path, &st)) {
        s->kind = ABSENT;
    } else if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlink(path, s->target, sizeof s->target - 1);
        if (n < 0) fail(path);
        s->target[n] = 0;
        s->kind = SYMLINK;
    } else {
        s->kind = S_ISDIR(st.st_mode) ? DIRECTORY : FILE_;
    }
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* `/usr` ... `/sbin`, then `/etc`'s fixed entries and its `python3*` ones, sorted. */
static void note_sources(void) {
    for (size_t i = 0; i < sizeof SYSTEM_RO / sizeof *SYSTEM_RO; i++) note_source(SYSTEM_RO[i]);
    char path[64];
    for (size_t i = 0; i < sizeof ETC_FIXED / sizeof *ETC_FIXED; i++) {
        snprintf(path, sizeof path, "/etc/%s", ETC_FIXED[i]);
        note_source(path);
    }
    DIR *etc = opendir("/etc");
    if (!etc) fail("/etc");
    char *names[16];
    int count = 0;
    for (struct dirent *e; (e = readdir(etc)) && count < 16;)
        if (!strncmp(e->d_name, "python3", 7)) names[count++] = strdup(e->d_name);
    closedir(etc);
    qsort(names, count, sizeof *names, by_name);
    for (int i = 0; i < count; i++) {
        snprintf(path, sizeof path, "/etc/%.50s", names[i]);
        note_source(path);
        free(names[i]);
    }
}

static void load_filter(const char *dir, const char *name, struct sock_fprog *prog) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_size == 0 || st.st_size % sizeof(struct sock_filter))
        fail(path);
    prog->filter = malloc(st.st_size);
    if (!prog->filter || read(fd, prog->filter, st.st_size) != st.st_size) fail(path);
    prog->len = st.st_size / sizeof(struct sock_filter);
    close(fd);
}

/* ---- the root (`execute.rs`), in PID 1's own mount namespace ---- */

static void check(int result, const char *what) {
    if (result) fail(what);
}

static void set_attrs(int dir, const char *path, uint64_t set, int recursive) {
    struct attrs a = {.set = set};
    unsigned flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
    check(syscall(SYS_mount_setattr, dir, path, flags, &a, sizeof a), path);
}

static void at_root(char *out, size_t size, const char *inner) {
    snprintf(out, size, NEW_ROOT "%.200s", inner);
}

static void mkdir_p(const char *path, mode_t mode) {
    if (!mkdir(path, mode) || errno == EEXIST) return;
    if (errno != ENOENT) fail(path);
    char parent[512];
    snprintf(parent, sizeof parent, "%s", path);
    *strrchr(parent, '/') = 0;
    mkdir_p(parent, 0755);
    check(mkdir(path, mode), path);
}

static void mount_tmpfs(const char *path, const char *options, int exec) {
    mkdir_p(path, 0755);
    unsigned long flags = MS_NOSUID | MS_NODEV | (exec ? 0 : MS_NOEXEC);
    check(mount("tmpfs", path, "tmpfs", flags, options), path);
}

/* A recursive bind, then its flags added in one `mount_setattr` (`restrict_bind`). */
static void bind(const char *src, const char *dst, int is_dir, uint64_t attrs) {
    if (is_dir) {
        mkdir_p(dst, 0755);
    } else {
        int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) fail(dst);
        close(fd);
    }
    check(mount(src, dst, NULL, MS_BIND | MS_REC, NULL), dst);
    set_attrs(AT_FDCWD, dst, attrs, is_dir);
}

static void write_file(const char *inner, const char *contents) {
    char path[512];
    at_root(path, sizeof path, inner);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0 || write(fd, contents, strlen(contents)) < 0) fail(path);
    close(fd);
    check(chmod(path, 0644), path);
}

static const char *DEVICE_NODES[] = {"null", "zero", "full", "random", "urandom"};
static const char *DEV_LINKS[][2] = {{"/proc/self/fd", "/dev/fd"},
                                     {"/proc/self/fd/0", "/dev/stdin"},
                                     {"/proc/self/fd/1", "/dev/stdout"},
                                     {"/proc/self/fd/2", "/dev/stderr"}};
static const char *PROC_READ_ONLY[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};
static const char *PROC_MASKED_FILES[] = {
    "kcore", "keys", "key-users", "kallsyms", "timer_list", "timer_stats", "sched_debug",
    "latency_stats", "kpagecount", "kpageflags", "kpagecgroup", "config.gz"};
static const char *PROC_MASKED_DIRS[] = {"acpi", "asound", "scsi"};
#define LEN(a) (sizeof a / sizeof *a)

static void build_root(void) {
    char path[512];
    check(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "make-private /");
    mount_tmpfs(NEW_ROOT, "size=4m,nr_inodes=4096,mode=0755", 0);
    const char *skeleton[] = {"/etc", "/proc", "/dev", "/tmp"};
    for (size_t i = 0; i < LEN(skeleton); i++) {
        at_root(path, sizeof path, skeleton[i]);
        check(mkdir(path, i == 1 ? 0555 : 0755), path);
    }
    write_file("/etc/passwd", "sandbox:x:65534:65534:airlock sandbox:" WORKDIR ":/bin/sh\n");
    write_file("/etc/group", "sandbox:x:65534:\n");
    write_file("/etc/hosts", "127.0.0.1 localhost airlock\n::1 localhost\n");
    write_file("/etc/hostname", "airlock\n");
    for (int i = 0; i < source_count; i++) {
        const struct source *s = &sources[i];
        at_root(path, sizeof path, s->path);
        if (s->kind == SYMLINK) {
            check(symlink(s->target, path), path);
        } else if (s->kind != ABSENT) {
            bind(s->path, path, s->kind == DIRECTORY, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV);
        }
    }
    for (size_t i = 0; i < LEN(DEVICE_NODES); i++) {
        char host[64];
        snprintf(host, sizeof host, "/dev/%s", DEVICE_NODES[i]);
        at_root(path, sizeof path, host);
        bind(host, path, 0, ATTR_NOSUID | ATTR_NOEXEC);
    }
    for (size_t i = 0; i < LEN(DEV_LINKS); i++) {
        at_root(path, sizeof path, DEV_LINKS[i][1]);
        check(symlink(DEV_LINKS[i][0], path), path);
    }
    mount_tmpfs(NEW_ROOT "/dev/shm", "size=67108864,nr_inodes=1024,mode=1777", 0);
    int mask = open(NEW_ROOT "/proc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (mask < 0) fail("/proc mount point");
    check(mount("proc", NEW_ROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "hidepid=invisible"),
          "proc");
    struct stat st;
    for (size_t i = 0; i < LEN(PROC_READ_ONLY); i++) {
        snprintf(path, sizeof path, NEW_ROOT "/proc/%s", PROC_READ_ONLY[i]);
        if (lstat(path, &st)) continue;
        int is_dir = S_ISDIR(st.st_mode);
        check(mount(path, path, NULL, MS_BIND | MS_REC, NULL), path);
        set_attrs(AT_FDCWD, path, SEALED, is_dir);
    }
    for (size_t i = 0; i < LEN(PROC_MASKED_FILES); i++) {
        snprintf(path, sizeof path, NEW_ROOT "/proc/%s", PROC_MASKED_FILES[i]);
        if (lstat(path, &st) || S_ISDIR(st.st_mode)) continue;
        check(mount("/dev/null", path, NULL, MS_BIND | MS_REC, NULL), path);
        set_attrs(AT_FDCWD, path, ATTR_RDONLY | ATTR_NOSUID | ATTR_NOEXEC, 0);
    }
    for (size_t i = 0; i < LEN(PROC_MASKED_DIRS); i++) {
        snprintf(path, sizeof path, NEW_ROOT "/proc/%s", PROC_MASKED_DIRS[i]);
        if (lstat(path, &st) || !S_ISDIR(st.st_mode)) continue;
        int tree = syscall(SYS_open_tree, mask, "", TREE_CLONE | O_CLOEXEC | AT_EMPTY_PATH);
        if (tree < 0) fail("open_tree");
        set_attrs(tree, "", SEALED, 0);
        check(syscall(SYS_move_mount, tree, "", AT_FDCWD, path, MOVE_F_EMPTY_PATH), path);
        close(tree);
    }
    close(mask);
    mount_tmpfs(NEW_ROOT "/tmp", "size=268435456,nr_inodes=10000,mode=1777", 0);
    mount_tmpfs(NEW_ROOT WORKDIR, "size=268435456,nr_inodes=10000,mode=755", 0);
    /* One pivot, one detach (`pivot_into_new_root`). */
    int old = open("/", O_RDONLY | O_CLOEXEC);
    if (old < 0) fail("/");
    check(chdir(NEW_ROOT), NEW_ROOT);
    check(syscall(SYS_pivot_root, ".", "."), "pivot_root");
    check(fchdir(old), "fchdir");
    check(umount2(".", MNT_DETACH), "detach the host");
    check(chdir("/"), "chdir /");
    close(old);
    set_attrs(AT_FDCWD, "/", SEALED, 0);
    check(chdir(WORKDIR), WORKDIR);
}

/* ---- Landlock, privileges, seccomp (`init/native.rs`'s `confine_with_root`) ---- */

static void grant(int ruleset, const char *path, uint64_t access) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return; /* a path that does not exist grants nothing */
    struct stat st;
    check(fstat(fd, &st), path);
    struct path_beneath rule = {.allowed = access, .parent_fd = fd};
    if (!S_ISDIR(st.st_mode)) rule.allowed &= LL_FILE_RIGHTS;
    check(syscall(SYS_landlock_add_rule, ruleset, 1 /* PATH_BENEATH */, &rule, 0), path);
    close(fd);
}

static void apply_landlock(void) {
    if (landlock_abi < 6) fail("landlock ABI 6 (the rights airlock asks for)");
    struct ruleset_attr attr = {.fs = LL_FS_ALL, .net = 3 /* bind, connect TCP */,
                                .scoped = 3 /* abstract unix sockets, signals */};
    int ruleset = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0) fail("landlock_create_ruleset");
    const uint64_t read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR;
    const uint64_t writable = LL_FS_ALL & ~LL_EXECUTE;
    for (size_t i = 0; i < LEN(SYSTEM_RO); i++) grant(ruleset, SYSTEM_RO[i], read);
    const char *read_exec[] = {"/etc", "/proc", "/dev"};
    for (size_t i = 0; i < LEN(read_exec); i++) grant(ruleset, read_exec[i], read);
    const char *read_write[] = {"/tmp", "/dev/shm", "/dev/null", "/dev/zero", "/dev/full",
                                WORKDIR};
    for (size_t i = 0; i < LEN(read_write); i++) grant(ruleset, read_write[i], writable);
    grant(ruleset, "/", LL_READ_DIR);
    check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs");
    check(syscall(SYS_landlock_restrict_self, ruleset, 0), "landlock_restrict_self");
    close(ruleset);
}

static void drop_capabilities(void) {
    int last = 40;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    if (f) {
        if (fscanf(f, "%d", &last) != 1) last = 40;
        fclose(f);
    }
    for (int cap = 0; cap <= last; cap++) check(prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "capbset");
    check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient");
    struct {
        uint32_t version;
        int pid;
    } header = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
    uint32_t data[6] = {0};
    check(syscall(SYS_capset, &header, data), "capset");
}

static void confine(void) {
    check(sethostname("airlock", 7), "sethostname");
    apply_landlock();
    check(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs");
    drop_capabilities();
    for (int i = 0; i < 2; i++)
        check(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &filters[i]), "seccomp");
}

/* ---- the processes of a run ---- */

static char *const TRUE_ARGV[] = {"/bin/true", NULL};
/* `show`: one run whose program prints what it got, to compare with a real sandbox's. */
static char *const SHOW_ARGV[] = {
    "/bin/sh", "-c",
    "cat /proc/self/mountinfo; grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' "
    "/proc/self/status; hostname; pwd",
    NULL};
static char *const *PROGRAM_ARGV = TRUE_ARGV;
static char *const PROGRAM_ENV[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};

static int program(void *unused) {
    (void)unused;
    execve(PROGRAM_ARGV[0], PROGRAM_ARGV, PROGRAM_ENV);
    _exit(127);
}

static void write_self(const char *file, const char *value) {
    put("/proc/self", file, value);
}

/* PID 1 of the run's namespaces. */
static int pid1(void *unused) {
    (void)unused;
    static char stack[1 << 14];
    check(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable");
    write_self("setgroups", "deny");
    write_self("uid_map", "65534 65534 1");
    write_self("gid_map", "65534 65534 1");
    check(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable");
    check(unshare(CLONE_NEWCGROUP), "unshare(CLONE_NEWCGROUP)");
    if (mode >= ROOT) build_root();
    if (mode >= CONFINE) {
        check(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "pdeathsig");
        confine();
    }
    if (mode >= PROGRAM) {
        pid_t child = clone(program, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
        if (child < 0) fail("clone the program");
        int status;
        while (waitpid(child, &status, 0) < 0) {}
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "the program failed: %#x\n", status);
            return 1;
        }
    }
    return 0;
}

static const int NAMESPACES =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;

/* The run's first process, sharing the caller's memory while the caller waits (the caller
 * stays root for the cgroup's removal): joins the cgroup, takes the run's rlimits and a
 * session, drops root, and starts PID 1 as the caller's child. */
static int holder(void *pid1_out) {
    static char stack[1 << 16];
    for (int i = 0; i < COUNT; i++)
        if (write(tasks[i], "0", 1) != 1) return 1;
    /* `untrusted`'s: no core, 60 s of CPU, 256 descriptors, 64 MiB files. */
    const struct rlimit limits[] = {{0, 0}, {60, 61}, {256, 256}, {64 << 20, 64 << 20}};
    const int resources[] = {RLIMIT_CORE, RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_FSIZE};
    for (int i = 0; i < 4; i++)
        if (setrlimit(resources[i], &limits[i])) return perror("setrlimit"), 1;
    if (setsid() < 0) return perror("setsid"), 1;
    /* Raw calls: the C library's set*id would signal every thread of a process sharing this
     * memory, and this process is not the caller's thread. */
    const gid_t groups[] = {SANDBOX_ID};
    if (syscall(SYS_setgroups, 1, groups) ||
        syscall(SYS_setresgid, SANDBOX_ID, SANDBOX_ID, SANDBOX_ID) ||
        syscall(SYS_setresuid, SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))
        return perror("drop root"), 1;
    pid_t pid = clone(pid1, stack + sizeof stack, CLONE_PARENT | NAMESPACES | SIGCHLD, NULL);
    *(volatile pid_t *)pid1_out = pid;
    if (pid < 0) perror("clone PID 1");
    return pid < 0;
}

static void one_run(int caller, long run) {
    static char stack[1 << 16];
    char dirs[COUNT][256];
    make_run_cgroup(dirs, tasks, "prepared", caller, run);
    volatile pid_t pid1_pid = -1;
    pid_t first =
        clone(holder, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, (void *)&pid1_pid);
    if (first < 0) fail("clone");
    for (int i = 0; i < COUNT; i++) close(tasks[i]);
    int status, failed = 0;
    while (waitpid(first, &status, 0) < 0) {}
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (pid1_pid > 0) {
        while (waitpid(pid1_pid, &status, 0) < 0) {}
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    if (failed) fail("the run failed");
    for (int i = 0; i < COUNT; i++)
        while (rmdir(dirs[i])) usleep(100);
}

int main(int argc, char **argv) {
    const char *modes[] = {"ns", "root", "confine", "program"};
    mode = PROGRAM + 1;
    for (int m = 0; argc > 4 && m <= PROGRAM; m++)
        if (!strcmp(argv[4], modes[m])) mode = m;
    if (argc > 4 && !strcmp(argv[4], "show")) mode = PROGRAM, PROGRAM_ARGV = SHOW_ARGV;
    if (argc < 5 || mode > PROGRAM || (mode >= CONFINE && argc < 6)) {
        fprintf(stderr,
                "usage: prepared_isolation CALLERS SECONDS MAX_RUNS ns|root|confine|program|show "
                "[SECCOMP_DIR]\n");
        return 125;
    }
    int callers = atoi(argv[1]);
    double seconds = atof(argv[2]);
    long max_runs = atol(argv[3]);
    note_sources();
    if (mode >= CONFINE) {
        load_filter(argv[5], "table.bpf", &filters[0]);
        load_filter(argv[5], "arguments-unix.bpf", &filters[1]);
        landlock_abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1 /* VERSION */);
    }
    return run_callers(callers, seconds, max_runs, one_run);
}
