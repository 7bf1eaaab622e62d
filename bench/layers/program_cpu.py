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


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages."""
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def quantile(sorted_us: list[int], q: float) -> float:
    """The q quantile (nearest rank below) of sorted microseconds, in ms."""
    return sorted_us[int(q * (len(sorted_us) - 1))] / 1000


def main() -> None:
    rounds = int(sys.argv[1])
    variants = [arg.split("=", 1) for arg in sys.argv[2:]]
    samples: dict[str, list[tuple[int, int, int, int]]] = {name: [] for name, _ in variants}
    load_start = loadavg()
    for i in range(rounds):
        for name, command in variants if i % 2 == 0 else variants[::-1]:
            # No check: a failed variant shows as the parse error of its missing output.
            out = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
            user, system, faults = map(int, out.stdout.split()[-3:])
            samples[name].append((user + system, user, system, faults))
    load_end = loadavg()
    print("load at start", " ".join(load_start), "at end", " ".join(load_end))
    median = statistics.median
    first = median(s[0] for s in samples[variants[0][0]])
    for name, _ in variants:
        totals = sorted(s[0] for s in samples[name])
        print(
            f"{name:20s} {median(totals) / 1000:6.2f} ms"
            f" (p25 {quantile(totals, 0.25):5.2f}, p75 {quantile(totals, 0.75):5.2f})"
            f" x{median(totals) / first:5.3f}"
            f"  user {median(s[1] for s in samples[name]) / 1000:5.2f}"
            f" sys {median(s[2] for s in samples[name]) / 1000:5.2f}"
            f" faults {median(s[3] for s in samples[name]):.0f}"
        )


if __name__ == "__main__":
    main()
