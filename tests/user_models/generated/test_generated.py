"""GIVEN sequence-parallel models (24 by default, more in CI: SPTRACE_GENERATED_DRAWS) drawn by
tests/user_models/generated/draw.py on 8 gloo ranks (B, S, H, F, heads, head dim, P of 2, 4 or 8,
dtype and autocast, layout, how the sequence is gathered and how partial sums return to shards,
activation checkpointing, a full-size positional parameter, bare or under sptrace.instrument,
steps, micro-batch order; colliding dimensions in most draws), each clean or keeping one stray
full-sequence tensor in one of six ways in one step, micro-batch and layer of its choosing,
written without sptrace's help, and torch's own record of each (job.py's truth: the planted
tensor's storage, read through a weak reference at its boundary)
WHEN `sptrace check` judges each with only the flags a user knows (B, S, H, P) (judge.py, run
right after the launch)
THEN every verdict is the truth's (score.py): FAIL exactly where, when and on which ranks the
stray was kept, about that very tensor; PASS where nothing was; CANNOT DECIDE only where the bare
trace lacks the evidence and the verdict names the remedy."""

from __future__ import annotations

import json

from tests.user_models.generated.draw import (
    ASSEMBLED,
    CHECKPOINTS,
    EXACT,
    GATHERS,
    OFFLOADS,
    SCATTERS,
    WAYS,
    WORLD,
    draws,
    late_in_grouped,
)  # fmt: skip
from tests.user_models.generated.score import WRONG, planted_on, score, tally

DRAWS = draws()


def test_the_draws_cover_what_the_gate_must_survive():
    assert len(DRAWS) >= 24 and WORLD == 8
    assert sum(bool(d.collisions) for d in DRAWS) * 2 >= len(DRAWS)
    assert {(d.stray["way"], d.layout) for d in DRAWS if d.stray} == {(w, lay) for w in WAYS for lay in ("bsh", "sbh")}
    assert sum(d.stray is None for d in DRAWS) >= 4
    assert {d.sp for d in DRAWS} == {2, 4, 8} and {d.dtype for d in DRAWS} >= {"float32", "bfloat16"}
    assert {d.gather for d in DRAWS} == set(GATHERS) and {d.scatter for d in DRAWS} == set(SCATTERS)
    assert {d.checkpoint for d in DRAWS} == set(CHECKPOINTS) and {d.instrumented for d in DRAWS} == {True, False}
    assert any(d.autocast for d in DRAWS) and any(d.pos_param and d.batch == 1 for d in DRAWS)
    assert any(d.steps > 1 for d in DRAWS) and {d.order for d in DRAWS if d.micro_batches > 1} == {
        "interleaved", "grouped"}  # fmt: skip
    assert any(d.stray and (d.stray["step"] or d.stray["micro_batch"]) for d in DRAWS)
    assert {d.checkpoint for d in DRAWS if late_in_grouped(d)} >= {"sac", "full"}
    # a stray that is a collective's own buffer, and one derived from it, bare and instrumented
    exact = {(d.gather in EXACT, d.instrumented) for d in DRAWS if d.kind in ("list", "attr", "hook")}
    assert exact == {(True, True), (True, False), (False, True), (False, False)}
    # the sequence assembled without an all-gather (an all-reduce of a padded shard, broadcasts, a
    # ring), each with a stray under both recipes (sptrace.instrument, and a bare profiler); each
    # clean too where the draws have room (every combination at CI's 42)
    assembled = {(d.gather, bool(d.stray), d.instrumented) for d in DRAWS if d.gather in ASSEMBLED}
    assert {(f, True, i) for f in ASSEMBLED for i in (True, False)} <= assembled
    assert len({f for f, stray, _ in assembled if not stray}) >= 2
    if len(DRAWS) >= 42:
        assert assembled == {(f, s, i) for f in ASSEMBLED for s in (True, False) for i in (True, False)}
    # offloaded saves (save_on_cpu, a copying pack hook): each as the stray's way and in a clean draw
    assert {(d.offload, d.kind == "offload") for d in DRAWS if d.offload} == {
        (o, s) for o in OFFLOADS for s in (True, False)}  # fmt: skip


def _truth(root, d) -> dict:
    return json.loads((root / "truth" / f"{d.name}.json").read_text())


def test_the_truth_saw_every_stray_kept_at_its_boundary(generated_runs):
    """The generator's own record: each planted tensor's storage was alive at its boundary on
    every rank (the stray is real, planted by the forward, never by a checkpoint's recomputation),
    and no clean draw planted one. (A clean draw's collective buffer may still be alive at a
    boundary on some ranks: gloo's work object holds it until its own thread lets go, which is
    the backend's hold, never the model's; score.py accepts CANNOT DECIDE there.)"""
    for d in DRAWS:
        truth = _truth(generated_runs, d)
        assert truth["draw"]["name"] == d.name and len(truth["ranks"]) == WORLD
        if d.stray:
            assert planted_on(truth) == list(range(WORLD)), d.name
            assert truth["stray"]["profiler_step"] is not None, d.name
        else:
            assert not planted_on(truth) and all(r["plant"] is None for r in truth["ranks"]), d.name


def test_check_equals_the_truth_on_every_drawn_model(generated_runs):
    results = []
    for d in DRAWS:
        result = json.loads((generated_runs / "checks" / f"{d.name}.json").read_text())
        report = result["report"]
        assert report is not None, (d.name, result["code"], result["stderr"])
        assert result["code"] == {"pass": 0, "fail": 1, "undecided": 2}[report["verdict"]["status"]]
        outcome, why = score(d.to_dict(), _truth(generated_runs, d), report)
        results.append((d.to_dict(), outcome, why))
    wrong = [f"{draw['name']} ({draw['stray']['way'] if draw['stray'] else 'clean'}, {draw['layout']}, "
             f"{draw['gather']}, {'instrumented' if draw['instrumented'] else 'bare'}): {outcome}: {why}"
             for draw, outcome, why in results if outcome in WRONG]  # fmt: skip
    assert not wrong, "\n".join(wrong)
    kinds = tally(results)
    # most draws are decided: a gate that said CANNOT DECIDE everywhere would pass the loop above
    assert sum(k["right"] for k in kinds.values()) * 4 >= len(DRAWS) * 3, kinds
    # every instrumented draw is decided: the census shows who holds each collective's buffer
    assert all(outcome == "right" for draw, outcome, _ in results if draw["instrumented"]), kinds
    # and every way of keeping a stray FAILs in both layouts
    failed = {
        (draw["stray"]["way"], draw["layout"]) for draw, outcome, _ in results if draw["stray"] and outcome == "right"
    }
    assert failed == {(w, lay) for w in WAYS for lay in ("bsh", "sbh")}, failed


def test_declaring_true_flags_never_turns_a_fail_into_a_pass(generated_runs):
    """The same draws judged again with every true flag the draw has (--ffn; --heads and
    --kv-heads where the head dim is H / a, which is what they declare): as right as with B, S, H
    and P alone, and never a PASS where those gave a FAIL."""
    wrong = []
    for d in DRAWS:
        result = json.loads((generated_runs / "checks" / f"{d.name}.json").read_text())
        bare, flagged = result["report"]["verdict"]["status"], result["report_flags"]["verdict"]["status"]
        if bare == "fail" and flagged != "fail":
            wrong.append(f"{d.name}: FAIL with B, S, H, P; {flagged} with every flag")
        outcome, why = score(d.to_dict(), _truth(generated_runs, d), result["report_flags"])
        if outcome in WRONG:
            wrong.append(f"{d.name} with every flag: {outcome}: {why}")
    assert not wrong, "\n".join(wrong)
