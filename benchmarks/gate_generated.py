"""The gate against the generator's truth: run `sptrace check` on every drawn model that
tests/user_models/generated/job.py profiled, and print one line per draw with the truth, the
verdict and whether they agree; a summary of false PASS / false FAIL / undecided last.

    python -m torch.distributed.run --standalone --nproc-per-node 4 \
        -m tests.user_models.generated.job --out /tmp/gen
    python benchmarks/gate_generated.py /tmp/gen [--only g03 g07] [--show]

The flags given to check are the ones a user knows without reading the trace: B, S, H and P
(the draw's), nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from sptrace.cli import main as sptrace


def flags(draw: dict) -> list[str]:
    return ["--batch", str(draw["batch"]), "--seq", str(draw["seq"]), "--hidden", str(draw["hidden"]),
            "--sp", str(draw["sp"])]  # fmt: skip


def judge(run: Path, cache: Path | None = None) -> tuple[str, str, dict, dict]:
    """(expected, got, truth, report) of one drawn run."""
    truth = json.loads((run.parent / "truth" / f"{run.name}.json").read_text())
    extra = ["--cache-dir", str(cache)] if cache else ["--no-cache"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = sptrace(["check", str(run), "--format", "json", "--workers", "1", *extra, *flags(truth["draw"])])
    report = json.loads(out.getvalue()) if out.getvalue().strip() else {"verdict": {"status": f"exit {code}"}}
    expected = "fail" if truth["draw"]["stray"] else "pass"
    return expected, report["verdict"]["status"], truth, report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--show", action="store_true", help="print the verdict line and findings of each miss")
    args = parser.parse_args()
    runs = sorted(args.root / p.stem for p in (args.root / "truth").glob("*.json"))
    if args.only:
        runs = [r for r in runs if r.name in args.only]
    tally = {"agree": 0, "false pass": 0, "false fail": 0, "undecided": 0}
    for run in runs:
        expected, got, truth, report = judge(run)
        d = truth["draw"]
        kind = (
            "agree"
            if got == expected
            else "false pass"
            if got == "pass"
            else "false fail"
            if got == "fail"
            else "undecided"
        )
        tally[kind] += 1
        stray = d["stray"] or {}
        print(f"{run.name} {expected:4} {got:9} {kind:10} {stray.get('way', 'clean'):8} "
              f"{','.join(d['collisions']) or '-':24} {d['layout']} {d['dtype']}")  # fmt: skip
        if args.show and kind != "agree":
            v = report.get("verdict", {})
            print("    ", v.get("line") or v)
            for f in report.get("findings", [])[:4]:
                print("     -", f.get("message", f)[:300])
    print(" ".join(f"{k}: {v}" for k, v in tally.items()), f"of {len(runs)}")
    return 0 if tally["agree"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
