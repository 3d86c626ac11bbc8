"""`sptrace check` on every draw the generator profiled, with the flags a user knows (B, S, H, P),
each verdict written beside the traces for test_generated.py to compare with the truth:

    python -m tests.user_models.generated.judge DIR

DIR/checks/<gNN>.json   {"code": exit code, "report": check's JSON report}

The suite runs this in its background thread right after the generator's launch, so its
checks overlap the tests that run meanwhile (tests/conftest.py)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from sptrace.cli import main as sptrace


def judge(run: Path) -> dict:
    """check's verdict with the flags a user knows (B, S, H, P), and again with every true flag
    the draw has (F; the heads where the head dim is H / a, as --heads declares it): declaring more
    must never turn a FAIL into a PASS."""
    draw = json.loads((run.parent / "truth" / f"{run.name}.json").read_text())["draw"]
    shape = ["--batch", str(draw["batch"]), "--seq", str(draw["seq"]), "--hidden", str(draw["hidden"]),
             "--sp", str(draw["sp"])]  # fmt: skip
    more = ["--ffn", str(draw["ffn"])]
    if draw["heads"] * draw["head_dim"] == draw["hidden"]:  # sptrace's --heads means d = H / a
        more += ["--heads", str(draw["heads"]), "--kv-heads", str(draw["heads"])]
    out = {}
    for key, flags in (("", shape), ("_flags", [*shape, *more])):
        stdout, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
            code = sptrace(["check", str(run), "--format", "json", "--workers", "1", "--no-cache", *flags])
        text = stdout.getvalue()
        out |= {f"code{key}": code, f"report{key}": json.loads(text) if text.strip() else None,
                f"stderr{key}": err.getvalue()[-2000:]}  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    args = parser.parse_args()
    checks = args.root / "checks"
    checks.mkdir(exist_ok=True)
    runs = [args.root / truth.stem for truth in sorted((args.root / "truth").glob("*.json"))]
    # two processes: by the time the suite's last launch is judged, its other core is free
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        for run, result in zip(runs, pool.map(judge, runs)):
            tmp = checks / f".{run.name}.json.tmp"
            tmp.write_text(json.dumps(result))
            os.replace(tmp, checks / f"{run.name}.json")
    (checks / "done").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
