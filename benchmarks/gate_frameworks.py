"""The gate on real framework layers at colliding shapes, per framework: right, false FAIL, false
PASS, CANNOT DECIDE, wrong layer, against torch's record (tests/user_models/frameworks/matrix.py).

    python benchmarks/gate_frameworks.py [--out DIR]        # profile the whole matrix (P = 2, 4, 8), judge
    python benchmarks/gate_frameworks.py --traces DIR       # judge a matrix already profiled
    python benchmarks/gate_frameworks.py --traces DIR --sptrace "python -m sptrace"   # another checkout's

The flags given to check are B, S, H and P. A stray is right only when every FAIL names a layer
the truth saw kept and every such layer is named. Prints a table by framework and each wrong
scenario; exits 1 when any is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTCOMES = ("right", "false FAIL", "false PASS", "CANNOT DECIDE", "wrong layer")


def profile(out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8", "-m",
           "tests.user_models.frameworks.matrix", "--out", str(out), "--full"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"the matrix's launch failed:\n{proc.stderr[-3000:]}")


def judge(run: Path, truth: dict, command: list[str]) -> tuple[str, str]:
    c = truth["config"]
    flags = ["--batch", str(c["batch"]), "--seq", str(c["seq"]), "--hidden", str(c["hidden"]), "--sp", str(c["sp"])]
    proc = subprocess.run([*command, "check", str(run), "--format", "json", "--no-cache", *flags], capture_output=True,
                          text=True)  # fmt: skip
    want = truth["want_exit"]
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return "CANNOT DECIDE", proc.stderr[-300:]
    line = f"{report['verdict']['label']}: {report['verdict']['summary'][:300]}"
    if proc.returncode == 2:
        return "CANNOT DECIDE", line
    if proc.returncode != want:
        return ("false FAIL" if want == 0 else "false PASS"), line
    layers = {f["layer"] for f in report["findings"] if f["code"] == "full-size-save"}
    if want and layers != set(truth["stray_layers"]):
        return "wrong layer", f"FAIL in layers {sorted(layers)}, the truth's {truth['stray_layers']}"
    return "right", ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, help="a folder matrix.py already profiled")
    parser.add_argument("--out", type=Path, help="where to profile (default: a scratch folder)")
    parser.add_argument("--sptrace", default=f"{sys.executable} -m sptrace", help="the command that runs sptrace")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.traces or args.out or Path(scratch)
        if args.traces is None:
            profile(root)
        truths = sorted((root / "truth").glob("*.json"))
        if not truths:
            sys.exit(f"no truth under {root / 'truth'}: not a profiled matrix")
        tally: dict[str, Counter[str]] = {}
        wrong = []
        for path in truths:
            truth = json.loads(path.read_text())
            outcome, why = judge(root / path.stem, truth, shlex.split(args.sptrace))
            tally.setdefault(truth["framework"], Counter())[outcome] += 1
            if outcome != "right":
                wrong.append(f"{path.stem}: {outcome}: {why}")
    print(f"{'framework':<15}" + "".join(f"{o:>15}" for o in OUTCOMES))
    for fw, counts in tally.items():
        print(f"{fw:<15}" + "".join(f"{counts[o]:>15}" for o in OUTCOMES))
    total = sum(tally.values(), Counter())
    print(f"{'all':<15}" + "".join(f"{total[o]:>15}" for o in OUTCOMES))
    for line in wrong:
        print(line)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
