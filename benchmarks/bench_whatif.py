"""What if at scale: ``sptrace whatif`` against ``sptrace analyze`` on the same N-rank run, side by side.

    python benchmarks/bench_whatif.py [--ranks 1024] [--source RUN] [--keep DIR]

The N-rank run is synthesized from a real one (``benchmarks/synth_run.py``: DLRM on 8 GPUs from
the corpus when it is there, else the committed 2-rank megatron run). Each command runs
in a fresh process (imports included), first with an empty cache (cold: the per-rank map parses
every trace) and then again (warm: the map's summaries are read back), with its default worker
processes. Printed: wall and CPU seconds of each cold, the wall seconds again (both replay their
kept result: sptrace/cli/result_cache.py), and the ratio whatif / analyze, which the issue wants at
most 1 (the replay and its critical path cost less than the checks analyze runs). Then the
replay alone, in process, per rank.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("SPTRACE_CORPUS") or HERE.parent.parent / "shared/corpus")
DLRM = CORPUS / "param_dlrm_kineto"
GOLDEN = HERE.parent / "tests" / "golden" / "runs" / "megatron"


def timed(argv: list[str], cache: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and its workers) of one command in a fresh process."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sptrace", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--source", type=Path, default=DLRM if DLRM.is_dir() else GOLDEN)
    parser.add_argument("--keep", type=Path, help="build the synthetic run here and keep it")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synth_run import synthesize  # the scale benchmarks' one generator

    scratch = Path(tempfile.mkdtemp(prefix="bench-whatif-"))
    run = args.keep or scratch / f"run{args.ranks}"
    if not run.exists():
        synthesize(args.source, args.ranks, run)
    print(f"{args.ranks} ranks synthesized from {args.source} (benchmarks/synth_run.py)")
    print(f"{'':<28}{'cold wall s':>12}{'cold CPU s':>12}{'again wall s':>14}")
    times = {}
    for name, argv in (("analyze", ["analyze", str(run)]), ("whatif --scale comm=0.5",
                                                             ["whatif", str(run), "--scale", "comm=0.5"])):  # fmt: skip
        cache = scratch / f"cache-{name.split()[0]}"
        (cold, cpu), (again, _) = timed(argv, cache), timed(argv, cache)
        times[name] = (cold, cpu)
        print(f"{name:<28}{cold:>12.1f}{cpu:>12.1f}{again:>14.2f}")
    (ac, acpu), (wc, wcpu) = times.values()
    print(
        f"{'whatif / analyze':<28}{wc / ac:>12.2f}{wcpu / acpu:>12.2f}   (target: at most 1; again: both "
        "replay their kept result)"
    )

    os.environ["XDG_CACHE_HOME"] = str(scratch / "cache-whatif")
    from sptrace.analysis import analyse_run
    from sptrace.reduce.replay import Changes, replay

    analysis = analyse_run(run, parts=("collectives", "whatif"))
    graph = analysis.replay_graphs[0]
    began = time.perf_counter()
    replay(graph, Changes(comm=0.5))
    spent = time.perf_counter() - began
    pieces = sum(len(p.kind) for p in graph.ranks.values())
    print(f"replay alone: {spent:.2f} s for {len(graph.ranks)} ranks, {pieces} pieces "
          f"({spent / len(graph.ranks) * 1e3:.2f} ms a rank)")  # fmt: skip
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
