#!/usr/bin/python3
"""What joining a fresh cgroup v1 run costs a freshly forked single-threaded process, by
writing "0" to `cgroup.procs` (whole thread group) or to `tasks` (calling thread only) in the
memory, pids, cpu, cpuacct and freezer hierarchies, as the airlock init's child does. Needs
root and cgroup v1 at /sys/fs/cgroup/<controller>.

    bench/cgroup_join.py [--runs 30]
"""

import argparse
import os
import statistics
import time

ROOT = "/sys/fs/cgroup"
HIERARCHIES = ["cpu", "cpuacct", "memory", "freezer", "pids"]


def join_once(control_file: str) -> float:
    name = f"airlock-bench-join-{os.getpid()}"
    dirs = [f"{ROOT}/{h}/{name}" for h in HIERARCHIES]
    for d in dirs:
        os.mkdir(d)
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            start = time.perf_counter()
            for d in dirs:
                with open(f"{d}/{control_file}", "w") as f:
                    f.write("0")
            os.write(write_end, repr(time.perf_counter() - start).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        os.close(write_end)
        return float(os.read(read_end, 64)) * 1000
    finally:
        for d in dirs:
            os.rmdir(d)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"cgroup.procs": [], "tasks": []}
    for _ in range(args.runs):
        for control_file, spans in samples.items():
            # Apart in time, like separate runs: a write right after another skips the wait.
            time.sleep(0.05)
            spans.append(join_once(control_file))
    for control_file, spans in samples.items():
        spans.sort()
        print(
            f"join via {control_file:<12} median {statistics.median(spans):6.2f} ms"
            f"  p90 {spans[int(len(spans) * 0.9)]:6.2f} ms  min {spans[0]:5.2f} ms"
            f"  ({len(spans)} runs)"
        )


if __name__ == "__main__":
    main()
