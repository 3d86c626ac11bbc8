"""The gate against the generator's truth, per kind of stray: false FAIL, false PASS, CANNOT
DECIDE, wrong place, and CANNOT DECIDE where a bare trace lacks the evidence (said, with its
remedy), scored by tests/user_models/generated/score.py, the rule the suite asserts.

    python benchmarks/gate_generated.py [--count 48] [--seed 0] [--out DIR]   # draw, profile, judge
    python benchmarks/gate_generated.py --traces DIR [--show]                 # judge a profiled DIR

Profiling launches tests/user_models/generated/job.py on 8 gloo ranks (about 3 s a draw on 2
cores, after the launch's start). The flags given to check are the ones a user knows without
reading the trace: B, S, H and P (the draw's), nothing else. Prints one table by kind, one by kind
and layout, the totals, and each wrong draw; exits 1 when any draw is wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sptrace.cli import main as sptrace  # noqa: E402
from tests.user_models.generated.score import OUTCOMES, WRONG, score, tally  # noqa: E402


def profile(out: Path, count: int, seed: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(out / "inductor"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8", "-m",
           "tests.user_models.generated.job", "--out", str(out), "--count", str(count),
           "--seed", str(seed)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"the generator's launch failed:\n{proc.stderr[-3000:]}")


def check(run: Path, draw: dict) -> dict:
    flags = ["--batch", str(draw["batch"]), "--seq", str(draw["seq"]), "--hidden", str(draw["hidden"]),
             "--sp", str(draw["sp"])]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        sptrace(["check", str(run), "--format", "json", "--workers", "1", "--no-cache", *flags])
    return json.loads(out.getvalue())


def table(title: str, rows: dict[str, dict[str, int]]) -> list[str]:
    width = max([len(title), *map(len, rows)])
    lines = [f"{title:{width}}  " + "  ".join(f"{o:>15}" for o in OUTCOMES)]
    lines += [f"{k:{width}}  " + "  ".join(f"{v[o]:>15}" for o in OUTCOMES) for k, v in rows.items()]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, help="a folder job.py already profiled")
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="where to profile (default: a scratch folder)")
    parser.add_argument("--show", action="store_true", help="the verdict of every draw, not only the wrong ones")
    args = parser.parse_args()
    root = args.traces
    if root is None:
        root = args.out or Path(tempfile.mkdtemp(prefix="sptrace-gate-"))
        profile(root, args.count, args.seed)
    results = []
    for path in sorted((root / "truth").glob("*.json")):
        truth = json.loads(path.read_text())
        draw = truth["draw"]
        outcome, why = score(draw, truth, check(root / draw["name"], draw))
        results.append((draw, outcome, why))
        if args.show or outcome in WRONG:
            print(f"{draw['name']} {draw['stray']['way'] if draw['stray'] else 'clean':8} {draw['layout']} "
                  f"{draw['gather']:11} {draw['scatter']:16} {draw['checkpoint']:4} "
                  f"{'instrumented' if draw['instrumented'] else 'bare':12} {outcome}: {why}")  # fmt: skip
    by_layout = tally([({**d, "stray": {"way": f"{d['stray']['way'] if d['stray'] else 'clean'} {d['layout']}"}},
                        o, w) for d, o, w in results])  # fmt: skip
    print("\n".join(["", *table("kind", tally(results)), "", *table("kind, layout", dict(sorted(by_layout.items())))]))
    wrong = sum(o in WRONG for _, o, _ in results)
    print(f"\n{len(results)} draws: {sum(o == 'right' for _, o, _ in results)} right, "
          f"{sum(o == 'lacked evidence' for _, o, _ in results)} cannot decide where a bare trace lacks the evidence, "
          f"{wrong} wrong")  # fmt: skip
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
