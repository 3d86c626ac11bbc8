"""GIVEN a reference run's trace with its sptrace.phase markers and ProfilerStep ranges taken out,
then its window repeated three times (benchmarks/synth_run.py's ``repeated``: a window of three
iterations with nothing to say where each begins)
WHEN `sptrace collectives` labels each collective's phase
THEN every iteration's collectives get the phases the marked trace gave them: the window is split
at each forward, not labelled backward from its first backward on."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from sptrace.cli import main

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from synth_run import repeated  # noqa: E402

RUN = REPO / "tests/golden/runs/megatron"


def phases(run: Path, capsys, cache: Path) -> list[str]:
    assert main(["collectives", str(run), "--format", "json", "--cache-dir", str(cache)]) == 0
    records = json.loads(capsys.readouterr().out)
    return [r["phase"] for r in sorted(records, key=lambda r: (r["rank"], r["start_us"]))]


def test_each_iteration_keeps_its_phases(tmp_path, capsys):
    marked = phases(RUN, capsys, tmp_path / "c1")
    assert {"forward", "backward"} <= set(marked)
    bare = tmp_path / "bare"
    bare.mkdir()
    for trace in RUN.glob("rank*.json.gz"):
        doc = json.loads(gzip.open(trace).read())
        unmarked = ("sptrace.phase::", "ProfilerStep#")
        events = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith(unmarked)]
        doc["traceEvents"] = [e for copy in repeated(events, 3) for e in copy]
        (bare / trace.name.removesuffix(".gz")).write_text(json.dumps(doc))
    (bare / "run.json").write_text((RUN / "run.json").read_text())
    got = phases(bare, capsys, tmp_path / "c2")
    per_rank = len(marked) // 2
    want = [p for rank in (0, 1) for p in marked[rank * per_rank : (rank + 1) * per_rank] * 3]
    assert got == want, [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w][:10]
