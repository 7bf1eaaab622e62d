/*
 * one_layer: applies one or more of airlock's confinement layers by hand, then forks and
 * executes a program, so that the program's own CPU (getrusage(RUSAGE_SELF) in it) can be
 * compared layer by layer with a bare run started the same way. The fork matters: a process
 * that executes in place keeps counting the launcher's own CPU and page faults. Used for
 * BENCHMARKS.md, "The program's own CPU inside a sandbox" (stop 38). Root only for -c.
 *
 *   one_layer [-s FILTER.bpf]... [-L] [-c CGROUP_DIR]... [-S USEC] [-M MIB] -- PROGRAM [ARGS...]
 *
 *   -s  install a raw sock_filter array as a seccomp filter (airlock's prebuilt ones:
 *       crates/airlock/src/confine/seccomp/prebuilt/x86_64/table.bpf, then arguments-*.bpf);
 *       give -s before -L when the files are outside the Landlock rules
 *   -L  Landlock handling every filesystem right up to ABI 6; read and execute under /usr,
 *       /lib, /lib64, /bin, /etc, /proc, /dev; everything under /tmp
 *   -c  join a cgroup (writes 0 to its cgroup.procs)
 *   -S  sleep before the fork; -M touch that many MiB before it (cold-start experiments)
 *
 * cc -O2 -o one_layer one_layer.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) { perror(what); exit(111); }

static void load_filter(const char *path)
{
	static char buf[65536];
	int fd = open(path, O_RDONLY);
	if (fd < 0) die(path);
	ssize_t n = read(fd, buf, sizeof buf);
	close(fd);
	if (n <= 0 || n % 8) die("filter size");
	struct sock_fprog prog = { .len = n / 8, .filter = (struct sock_filter *)buf };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) die("seccomp");
}

static void add_rule(int ruleset, const char *path, unsigned long long access)
{
	int fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0) return;
	struct landlock_path_beneath_attr attr = { .allowed_access = access, .parent_fd = fd };
	if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &attr, 0))
		die("landlock_add_rule");
	close(fd);
}

static void landlock(void)
{
	unsigned long long all = (1ULL << 16) - 1; /* every filesystem right of ABI 5 and 6 */
	struct landlock_ruleset_attr attr = { .handled_access_fs = all };
	int ruleset = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (ruleset < 0) die("landlock_create_ruleset");
	unsigned long long read_exec = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
				       LANDLOCK_ACCESS_FS_READ_DIR;
	const char *trees[] = { "/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", "/dev", 0 };
	for (int i = 0; trees[i]; i++) add_rule(ruleset, trees[i], read_exec);
	add_rule(ruleset, "/tmp", all);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
	if (syscall(SYS_landlock_restrict_self, ruleset, 0)) die("landlock_restrict_self");
}

static void join(const char *dir)
{
	char path[512];
	snprintf(path, sizeof path, "%s/cgroup.procs", dir);
	int fd = open(path, O_WRONLY);
	if (fd < 0 || write(fd, "0", 1) != 1) die(path);
	close(fd);
}

int main(int argc, char **argv)
{
	int i = 1;
	for (; i < argc && strcmp(argv[i], "--"); i++) {
		if (!strcmp(argv[i], "-s") && i + 1 < argc) load_filter(argv[++i]);
		else if (!strcmp(argv[i], "-L")) landlock();
		else if (!strcmp(argv[i], "-c") && i + 1 < argc) join(argv[++i]);
		else if (!strcmp(argv[i], "-S") && i + 1 < argc) usleep(atoi(argv[++i]));
		else if (!strcmp(argv[i], "-M") && i + 1 < argc) {
			size_t n = (size_t)atoi(argv[++i]) << 20;
			char *m = malloc(n);
			if (!m) die("malloc");
			for (int pass = 0; pass < 2; pass++) memset(m, pass + 1, n);
			free(m);
		} else {
			fprintf(stderr, "unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (i + 1 >= argc) { fprintf(stderr, "usage: see the header\n"); return 2; }
	pid_t pid = fork();
	if (pid < 0) die("fork");
	if (pid == 0) { execv(argv[i + 1], argv + i + 1); die("execv"); }
	int status;
	if (waitpid(pid, &status, 0) < 0) die("waitpid");
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
