"""GIVEN 24 sequence-parallel models (42 in CI: SPTRACE_GENERATED_DRAWS) drawn by
tests/user_models/generated/draw.py (B, S, H, F,
heads, head dim, P, dtype, layout, steps, micro-batch order; colliding dimensions in most draws)
and written without sptrace (plain torch.distributed, torch.profiler), each clean or keeping one
stray full-sequence tensor in one of six ways in one step, micro-batch and layer of its choosing
WHEN `sptrace check` judges each with only the flags a user knows (B, S, H, P) (judge.py, run
right after the launch)
THEN the verdict equals the draw's own truth: FAIL exactly where a stray was placed, PASS where
none was, and CANNOT DECIDE only where the draw says its trace cannot show enough."""

from __future__ import annotations

import json
import math
from collections import Counter

from tests.user_models.generated.draw import WAYS, draws

DRAWS = draws()


def test_the_draws_cover_what_the_gate_must_survive():
    assert len(DRAWS) >= 24
    assert sum(bool(d.collisions) for d in DRAWS) * 2 >= len(DRAWS)
    assert {d.stray["way"] for d in DRAWS if d.stray} == set(WAYS)
    assert sum(d.stray is None for d in DRAWS) >= 8
    assert {d.layout for d in DRAWS} == {"bsh", "sbh"} and {d.dtype for d in DRAWS} >= {"float32", "bfloat16"}
    assert any(d.steps > 1 for d in DRAWS) and any(d.micro_batches > 1 and d.order == "grouped" for d in DRAWS)
    assert any(d.stray and (d.stray["step"] or d.stray["micro_batch"]) for d in DRAWS)


def _check(root, d) -> tuple[int, dict]:
    """check's exit code and JSON report on one draw (written by judge.py)."""
    result = json.loads((root / "checks" / f"{d.name}.json").read_text())
    assert result["report"] is not None, (d.name, result["code"], result["stderr"])
    return result["code"], result["report"]


def test_check_equals_the_truth_on_every_drawn_model(generated_runs):
    tally, wrong = Counter(), []
    for d in DRAWS:
        truth = json.loads((generated_runs / "truth" / f"{d.name}.json").read_text())
        if d.stray:  # torch saw the stray where the draw put it (the generator's own record)
            assert truth["stray"] is not None and truth["stray"]["way"] == d.stray["way"], d.name
            kept = [*truth["census"]["held"], *truth["census"]["saved"]]
            if d.stray["way"] != "sac":  # SAC's cache is not autograd's: no pack hook sees it
                assert any(math.prod(s) >= d.batch * d.seq * d.hidden for s in kept), d.name
        code, report = _check(generated_runs, d)
        got = report["verdict"]["status"]
        expected = "fail" if d.stray else "pass"
        assert code == {"pass": 0, "fail": 1, "undecided": 2}[got]
        tally[got if got != expected else "agree"] += 1
        if got == expected:
            if got == "fail":  # the finding names the layer, step and micro-batch the stray ran in
                found = [f for f in report["findings"] if f["code"] == "full-size-save"]
                mine = [f["message"] for f in found if f["layer"] == d.stray["layer"]]
                assert mine, (d.name, [f["message"] for f in found])
                if d.steps > 1:  # the profiler's own step number when the stray ran
                    assert any(f"step {truth['stray']['profiler_step']}" in m for m in mine), (d.name, mine)
                if d.micro_batches > 1:
                    assert any(f"micro-batch {d.stray['micro_batch']}" in m for m in mine), (d.name, mine)
            continue
        if got == "undecided" and d.undecidable():
            continue
        wrong.append(f"{d.name}: truth {expected}, check {got}: {report['verdict']}")
    assert not wrong, "\n".join(wrong)
    # most draws are decided: a gate that said CANNOT DECIDE everywhere would pass the loop above
    assert tally["agree"] * 2 >= len(DRAWS), tally
