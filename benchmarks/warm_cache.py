"""What the cache saves a user: each command cold and warm, side by side, in fresh processes.

    python benchmarks/warm_cache.py [--repeats 3] [--command collectives --command analyze ...] [RUN ...]

For every run and command (default: ``collectives``, ``analyze``, ``info`` and ``check`` on the
DLRM run of the real-trace corpus, 8 ranks, 26k events), the wall time of a fresh ``sptrace``
process (``check`` is never replayed: its ``replay`` is another ``warm``):

- ``no-cache``: ``--no-cache``, every rank parsed and summarized;
- ``cold``: a fresh ``--cache-dir``: parsed, summarized, both written to the cache;
- ``tables``: warm with the parsed tables alone (the summary entries deleted first): what the
  cache did before it kept summaries;
- ``warm``: the same cache again, its kept results deleted: every rank's summary read back,
  nothing parsed or detected; the cross-rank reduce and the printing run again;
- ``replay``: the same command once more: the result ``warm`` kept (sptrace.cli.result_cache) is
  printed again, with neither pandas nor pyarrow imported. What a command repeated on an
  unchanged run costs; another flag or format is a ``warm``.

Medians over ``--repeats`` rounds (each round a fresh cache directory), and the ratios to
``warm`` and ``replay``. Every mode must print what ``--no-cache`` prints (stdout and stderr),
and exit with its code (analyze's verdict), or the benchmark stops. The ``floor`` line is a
fresh process that only imports what a warm ``collectives`` or ``analyze`` must (sptrace's CLI,
pandas): the part of ``warm`` that only a replay avoids.

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
COMMANDS = ("collectives", "analyze", "info", "check")
MODES = ("no-cache", "cold", "tables", "warm", "replay")


# bytecode cached, as an installed package has it, in a folder of the benchmark's own (not the checkout)
PYCACHE = tempfile.mkdtemp(prefix="sptrace-warm-pycache-")
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPYCACHEPREFIX": PYCACHE}


def timed(argv: list[str]) -> tuple[float, int, str]:
    """(wall seconds, exit code, stdout and stderr) of a fresh process running ``argv``."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    return time.perf_counter() - start, done.returncode, done.stdout + "\n[stderr]\n" + done.stderr


def sptrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "sptrace", *args]


def one_round(run: Path, command: str) -> tuple[dict[str, float], int]:
    """One fresh cache directory: the four modes' seconds, in the order that builds each one's
    state, and the command's exit code (analyze's verdict). Every mode must print the same."""
    store = Path(tempfile.mkdtemp(prefix="sptrace-warm-"))
    cached = ("--cache-dir", str(store))
    try:
        seconds, outputs = {}, {}
        for mode in MODES:
            if mode == "tables":  # the tables alone: the cache as it was before it kept summaries
                for entry in store.glob("*.summary"):
                    entry.unlink()
            if mode in ("tables", "warm"):  # computed, not replayed
                shutil.rmtree(store / "results", ignore_errors=True)
            seconds[mode], code, out = timed(
                sptrace(command, str(run), *(("--no-cache",) if mode == "no-cache" else cached))
            )
            outputs[mode] = (code, out)
        differ = [m for m in MODES if outputs[m] != outputs["no-cache"]]
        if differ or not outputs["warm"][1]:
            codes = {m: code for m, (code, _) in outputs.items()}
            raise SystemExit(f"sptrace {command} {run}: {differ or 'none'} printed other than --no-cache, or "
                             f"nothing (exit codes {codes})")  # fmt: skip
        return seconds, outputs["warm"][0]
    finally:
        shutil.rmtree(store, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help=f"run folders or trace files (default: {DEFAULT_RUN})")
    parser.add_argument("--command", action="append", choices=COMMANDS, help="default: all four")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = args.runs or [DEFAULT_RUN]
    for run in runs:
        if not run.exists():
            raise SystemExit(f"{run}: not found (set SPTRACE_CORPUS, or name a run)")
    try:
        return report(runs, args.command or COMMANDS, args.repeats)
    finally:
        shutil.rmtree(PYCACHE, ignore_errors=True)


def report(runs: list[Path], commands: list[str], repeats: int) -> int:
    timed(sptrace("info", "--no-cache", str(runs[0])))  # bytecode compiled once (into PYCACHE)
    timed(sptrace("analyze", "--no-cache", str(runs[0])))
    floor = statistics.median(
        timed([sys.executable, "-c", "import sptrace.cli, sptrace.run.map, pandas"])[0] for _ in range(repeats)
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; medians of {repeats} rounds, seconds")
    print(f"floor (a fresh process importing sptrace's CLI and pandas): {floor:.2f}")
    versus_info = []
    for run in runs:
        info = None
        for command in sorted(commands, key=lambda c: c != "info"):  # info first: the others' yardstick
            rounds = [one_round(run, command) for _ in range(repeats)]
            median = {m: statistics.median(seconds[m] for seconds, _ in rounds) for m in MODES}
            if command == "info":
                info = median["no-cache"]
            elif info and command in ("check", "analyze"):
                versus_info.append(f"{command} {run.name}: cold {median['cold']:.2f} s = "
                                   f"{median['cold'] / info:.1f}x info --no-cache ({info:.2f} s)")  # fmt: skip
            cells = "  ".join(f"{m} {median[m]:.2f}" for m in MODES)
            ratios = "  ".join(f"{m}/warm {median[m] / median['warm']:.1f}x" for m in ("no-cache", "cold", "tables"))
            ratios += f"  warm/replay {median['warm'] / median['replay']:.1f}x"
            code = f"  (exit {rounds[0][1]})" if rounds[0][1] else ""
            print(f"{command:<12} {run.name}: {cells}   {ratios}{code}")
    print("\n".join(versus_info))
    print(
        "issue 22's target: `check` and `analyze` of each demo run in <= 2 s wall; issue 36's: cold, each at "
        "most 4x `info --no-cache` (pass --command info too)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
