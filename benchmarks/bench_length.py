"""How `sptrace check` grows with a rank's length: one rank of a run, its profiled window repeated
100, 200, 400 and 800 times (synth_run's ``--repeat``), in fresh processes, side by side with the
parse alone (`sptrace info --no-cache`).

    python benchmarks/bench_length.py [--source RUN] [--copies 100 200 400 800] [--rank 0] [--other CHECKOUT]

Prints each length's events, the CPU seconds of the parse and of the check, and the check's
growth per doubling (linear is 2.0; issue 51's target is at most 2.2), for this checkout and, with
``--other``, another one's sources (its root put first on PYTHONPATH). The source must have memory
events and a backward (a profiled training step: ``sptrace profile --scheme megatron --steps 1
--out RUN``); its run.json comes along, so no flags are needed (``--check-flags`` adds some).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from synth_run import write_lengthened  # noqa: E402

from sptrace.load.files import find_traces  # noqa: E402


def _cpu_of(cmd: list[str], checkout: Path | None = None) -> tuple[float, float, int]:
    """(wall, CPU seconds, exit code) of one fresh process (``checkout``: the sptrace it imports,
    else the installed one); the CPU is the process's own and its reaped children's, from wait4."""
    env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="a profiled run (a rank of it is lengthened)")
    ap.add_argument("--copies", type=int, nargs="+", default=[100, 200, 400, 800])
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--check-flags", default="", help="flags for check beyond run.json's (one string)")
    ap.add_argument("--other", type=Path, help="another checkout of sptrace to time beside this one (its root)")
    args = ap.parse_args()
    files, _ = find_traces(args.source)
    one = [f for f in files if f.name.startswith(f"rank{args.rank}.")]
    if not one:
        print(f"{args.source}: no rank {args.rank} trace", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-length-"))
    try:
        src = root / "source"
        src.mkdir()
        shutil.copy(one[0], src / one[0].name)
        if (args.source / "run.json").is_file():
            shutil.copy(args.source / "run.json", src / "run.json")
        tools = [("this", None), *([("other", args.other)] if args.other else [])]
        print(f"{'copies':>7} {'MB':>8} {'tool':>6} {'info CPU s':>11} {'check CPU s':>12} {'check/info':>11} "
              f"{'per doubling':>13}")  # fmt: skip
        last: dict[str, float] = {}
        for n in args.copies:
            run = root / f"x{n}"
            write_lengthened(src, n, run)
            mb = sum(f.stat().st_size for f in run.iterdir()) / 1e6
            for tool, checkout in tools:
                _, info, _ = _cpu_of([sys.executable, "-m", "sptrace", "info", str(run), "--no-cache"], checkout)
                check_cmd = [sys.executable, "-m", "sptrace", "check", str(run), "--no-cache", "--workers", "1"]
                _, check, code = _cpu_of([*check_cmd, *args.check_flags.split()], checkout)
                growth = f"{check / last[tool]:.2f}x" if tool in last else ""
                print(f"{n:>7} {mb:>8.1f} {tool:>6} {info:>11.1f} {check:>12.1f} {check / info:>11.1f} {growth:>13}"
                      f"  (exit {code})")  # fmt: skip
                last[tool] = check
            shutil.rmtree(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
