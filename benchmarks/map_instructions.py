"""The per-rank map's cost in instructions, which this project's shared 2-core machines do not blur.

    python benchmarks/map_instructions.py [--ranks 10] [--parts collectives,path] [RUN] [--against DIR]

Wall and CPU times of the same code move by a quarter, at times by half, within minutes on these
machines, which hides a change of a few percent in a rank's map. Instructions retired do not move:
this script runs ``sptrace.run.map.map_one`` (no cache) over the first ``--ranks`` trace files of
RUN under Valgrind's callgrind, once over one file and once over ``--ranks`` + 1 files, and prints
the difference per rank (so imports and the first call's set-up drop out). Python's hash seed is
fixed, so that set and dict orders, and with them the work done, repeat from run to run (left
free, the figure moves by about 0.7%).

``--against DIR``: a second checkout of sptrace (``git worktree add DIR REV``, its native decoder
built or copied there) measured the same way, side by side, with the ratio. Both run at once, one
per core. Callgrind runs Python about 50x slower: 10 ranks of the corpus's DLRM take about 80 s.

Default RUN: ``param_dlrm_kineto`` from the corpus (SPTRACE_CORPUS, or ../shared/corpus beside
the checkout). Valgrind must be installed (``apt-get install valgrind``); nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_MAP = """
import sys
from pathlib import Path
from sptrace.run.map import MapSpec, map_one
spec = MapSpec(tuple(sys.argv[1].split(",")), cache=False)
for f in sys.argv[2:]:
    map_one(Path(f), spec)
"""


def _default_run() -> Path:
    corpus = Path(os.environ.get("SPTRACE_CORPUS", ROOT.parent / "shared" / "corpus"))
    return corpus / "param_dlrm_kineto"


def _trace_files(run: Path, n: int) -> list[Path]:
    files = sorted(p for p in run.rglob("*") if p.is_file() and re.search(r"\.json(\.gz)?$", p.name))
    if len(files) < 2:
        sys.exit(f"{run}: fewer than 2 trace files")
    return [files[i % len(files)] for i in range(n + 1)]  # (a small run's files again, in turn)


def _instructions(checkout: Path, parts: str, files: list[Path]) -> int:
    """Instructions callgrind counted for one process mapping ``files``."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "map.py"
        script.write_text(_MAP)
        env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONHASHSEED": "0"}
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, str(script), parts,
               *map(str, files)]  # fmt: skip
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or not found:
            sys.exit(f"callgrind failed ({checkout}):\n{done.stderr[-2000:]}")
        return int(found.group(1))


def per_rank(checkout: Path, parts: str, files: list[Path]) -> float:
    """Instructions a rank: ``files`` minus the first one's run, over the rest."""
    return (_instructions(checkout, parts, files) - _instructions(checkout, parts, files[:1])) / (len(files) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", type=Path, default=None, help="a run folder (default: the corpus's DLRM)")
    ap.add_argument("--ranks", type=int, default=10, help="trace files mapped (after the first)")
    ap.add_argument("--parts", default="collectives,path", help="MapSpec parts (analyze's by default)")
    ap.add_argument("--against", type=Path, default=None, help="another sptrace checkout, measured beside this one")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    run = args.run or _default_run()
    files = _trace_files(run, args.ranks)
    checkouts = [ROOT] + ([args.against.resolve()] if args.against else [])
    with ThreadPoolExecutor(len(checkouts)) as pool:
        counts = list(pool.map(lambda c: per_rank(c, args.parts, files), checkouts))
    print(f"{run}: {args.ranks} ranks mapped ({args.parts}), instructions a rank (callgrind)")
    for checkout, count in zip(checkouts, counts):
        print(f"  {count / 1e6:8.2f} M  {checkout}")
    if len(counts) == 2:
        print(f"  this checkout / the other: {counts[0] / counts[1]:.3f}")


if __name__ == "__main__":
    main()
