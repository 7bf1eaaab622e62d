#!/usr/bin/env python3
"""The program's own CPU, variant by variant, in alternated rounds (BENCHMARKS.md, stop 38).

    program_cpu.py ROUNDS NAME=SHELL_COMMAND ...

Each command must end by running a program that prints "UTIME_US STIME_US MINFLT" of itself,
for example

    /usr/bin/python3 -c 'import resource; r=resource.getrusage(0);
        print(int(r.ru_utime*1e6), int(r.ru_stime*1e6), r.ru_minflt)'

started bare through `one_layer --` (which forks, so the launcher's CPU is not counted), under
`one_layer -s ... -L -c ...`, or as `airlock run -- ...`. Rounds alternate the order (forward,
then backward), so every variant follows the others as often. Prints the medians (user + sys,
precise as a sum; the split between them is by tick), the quartiles and the ratio to the first
variant. Use the same environment in every variant: the caller's PYTHON* variables change what
Python does.
"""
import statistics
import subprocess
import sys


def main():
    rounds = int(sys.argv[1])
    variants = [arg.split("=", 1) for arg in sys.argv[2:]]
    samples = {name: [] for name, _ in variants}
    load_start = open("/proc/loadavg").read().split()[:3]
    for i in range(rounds):
        for name, command in variants if i % 2 == 0 else variants[::-1]:
            out = subprocess.run(command, shell=True, capture_output=True, text=True)
            user, system, faults = map(int, out.stdout.split()[-3:])
            samples[name].append((user + system, user, system, faults))
    load_end = open("/proc/loadavg").read().split()[:3]
    print("load at start", " ".join(load_start), "at end", " ".join(load_end))
    median = statistics.median
    first = median(s[0] for s in samples[variants[0][0]])
    for name, _ in variants:
        totals = sorted(s[0] for s in samples[name])
        quartile = lambda q: totals[int(q * (len(totals) - 1))] / 1000
        print(
            f"{name:20s} {median(totals) / 1000:6.2f} ms"
            f" (p25 {quartile(0.25):5.2f}, p75 {quartile(0.75):5.2f}) x{median(totals) / first:5.3f}"
            f"  user {median(s[1] for s in samples[name]) / 1000:5.2f}"
            f" sys {median(s[2] for s in samples[name]) / 1000:5.2f}"
            f" faults {median(s[3] for s in samples[name]):.0f}"
        )


if __name__ == "__main__":
    main()
