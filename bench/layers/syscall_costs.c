/*
 * syscall_costs: CPU per call (ns, getrusage of this process) of three loops of 100,000:
 * getppid (a syscall the seccomp action cache covers), stat of a file four levels down
 * (a path walk; Landlock has no stat hook), open+close of a read-only file (seccomp's
 * argument-dependent openat, Landlock's open hook). Run it bare, under one_layer and inside
 * `airlock run --ro DIR` to price each layer per call (BENCHMARKS.md, stop 38).
 *
 * cc -O2 -o syscall_costs syscall_costs.c
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static double cpu_us(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_sec * 1e6 +
	       r.ru_stime.tv_usec;
}

int main(int argc, char **argv)
{
	const char *deep = argc > 1 ? argv[1] : "/usr/lib/python3.11/json/decoder.py";
	const char *file = argc > 2 ? argv[2] : "/usr/lib/python3.11/os.py";
	const int n = 100000;
	struct stat st;
	double t0 = cpu_us();
	for (int i = 0; i < n; i++) syscall(SYS_getppid);
	double t1 = cpu_us();
	for (int i = 0; i < n; i++) stat(deep, &st);
	double t2 = cpu_us();
	for (int i = 0; i < n; i++) close(open(file, O_RDONLY));
	double t3 = cpu_us();
	printf("getppid %.0f ns, stat %.0f ns, open+close %.0f ns\n", (t1 - t0) * 1000 / n,
	       (t2 - t1) * 1000 / n, (t3 - t2) * 1000 / n);
	return 0;
}
