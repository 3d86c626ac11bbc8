"""What the cache saves a user: each command cold and warm, side by side, in fresh processes.

    python benchmarks/warm_cache.py [--repeats 3] [--command collectives --command analyze ...] [RUN ...]

For every run and command (default: ``collectives``, ``analyze`` and ``info`` on the DLRM run
of the real-trace corpus, 8 ranks, 26k events), the wall time of a fresh ``sptrace`` process:

- ``no-cache``: ``--no-cache``, every rank parsed and summarized;
- ``cold``: a fresh ``--cache-dir``: parsed, summarized, both written to the cache;
- ``tables``: warm with the parsed tables alone (the summary entries deleted first): what the
  cache did before it kept summaries;
- ``warm``: the same cache again: every rank's summary read back, nothing parsed or detected.

Medians over ``--repeats`` rounds (each round a fresh cache directory), and the ratios to
``warm``. The ``floor`` line is a fresh process that only imports what a warm ``collectives``
or ``analyze`` must (sptrace's CLI, pandas): the part of ``warm`` no cache can remove.

Default run: ``param_dlrm_kineto`` from the corpus (SPTRACE_CORPUS, or ../shared/corpus beside
the checkout); traces are read in place, never copied.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("SPTRACE_CORPUS") or HERE.parent.parent / "shared/corpus")
DEFAULT_RUN = CORPUS / "param_dlrm_kineto"
COMMANDS = ("collectives", "analyze", "info")
MODES = ("no-cache", "cold", "tables", "warm")


def timed(argv: list[str]) -> float:
    """Wall seconds of a fresh process running ``argv`` (its output discarded; a failure raises)."""
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return seconds


def sptrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "sptrace", *args]


def one_round(run: Path, command: str) -> dict[str, float]:
    """One fresh cache directory: the four modes, in the order that builds each one's state."""
    store = Path(tempfile.mkdtemp(prefix="sptrace-warm-"))
    try:
        out = {"no-cache": timed(sptrace(command, str(run), "--no-cache"))}
        out["cold"] = timed(sptrace(command, str(run), "--cache-dir", str(store)))
        for entry in store.glob("*.summary"):  # the tables alone: the cache as it was
            entry.unlink()
        out["tables"] = timed(sptrace(command, str(run), "--cache-dir", str(store)))
        out["warm"] = timed(sptrace(command, str(run), "--cache-dir", str(store)))
        return out
    finally:
        shutil.rmtree(store, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help=f"run folders or trace files (default: {DEFAULT_RUN})")
    parser.add_argument("--command", action="append", choices=COMMANDS, help="default: all three")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = args.runs or [DEFAULT_RUN]
    for run in runs:
        if not run.exists():
            raise SystemExit(f"{run}: not found (set SPTRACE_CORPUS, or name a run)")
    timed(sptrace("--help"))  # bytecode compiled once, as an installed package has it
    floor = statistics.median(
        timed([sys.executable, "-c", "import sptrace.cli, sptrace.rankmap, pandas"]) for _ in range(args.repeats)
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; medians of {args.repeats} rounds, seconds")
    print(f"floor (a fresh process importing sptrace's CLI and pandas): {floor:.2f}")
    for run in runs:
        for command in args.command or COMMANDS:
            rounds = [one_round(run, command) for _ in range(args.repeats)]
            median = {m: statistics.median(r[m] for r in rounds) for m in MODES}
            cells = "  ".join(f"{m} {median[m]:.2f}" for m in MODES)
            ratios = "  ".join(f"{m}/warm {median[m] / median['warm']:.1f}x" for m in ("no-cache", "cold", "tables"))
            print(f"{command:<12} {run.name}: {cells}   {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
