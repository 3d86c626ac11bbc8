"""`analyze` and `check` against `info`, each with --no-cache in fresh processes: what a command
costs past reading the run (issue 51 asks for at most 2x on an 8-rank reference run).

    python benchmarks/bench_commands.py RUN [RUN ...] [--repeats 7]

Each command runs once first (the bytecode cached, as an install has it), then the three run in
turn, ``--repeats`` times; the medians of wall time and of the children's user + system CPU
time, and their ratios to `info`'s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = ("info", "analyze", "check")


def cost(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for run in args.runs:
        argvs = {c: [sys.executable, "-m", "sptrace", c, "--no-cache", run] for c in COMMANDS}
        for argv in argvs.values():
            cost(argv, env)
        samples: dict[str, list[tuple[float, float]]] = {c: [] for c in COMMANDS}
        for _ in range(args.repeats):
            for command, argv in argvs.items():
                samples[command].append(cost(argv, env))
        wall = {c: statistics.median(w for w, _ in s) for c, s in samples.items()}
        cpu = {c: statistics.median(u for _, u in s) for c, s in samples.items()}
        print(f"{run}: medians of {args.repeats}, fresh processes, --no-cache")
        for c in COMMANDS:
            print(
                f"  {c:<8} wall {wall[c]:6.3f} s ({wall[c] / wall['info']:.2f}x info)"
                f"   CPU {cpu[c]:6.3f} s ({cpu[c] / cpu['info']:.2f}x info)"
            )


if __name__ == "__main__":
    main()
