"""GIVEN one 8-rank gloo job that splits the world into groups of P = 1, 2, 4, 8
WHEN every scheme (ring attention in its zigzag layout too) runs a step on its group with the
     dense model's weights
THEN the loss and every parameter gradient match the single-process dense model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.distributed

TOL = 2e-5  # fp32, max abs error relative to the largest dense value


def test_every_case_ran_on_every_rank(verify_reports):
    names = [set(r["equivalence"]) for r in verify_reports]
    assert all(n == names[0] for n in names)
    for scheme in ("megatron", "ulysses", "hybrid", "ring"):
        for P in (1, 2, 4, 8):
            for kv in (8, 2):
                assert f"{scheme}-P{P}-kv{kv}" in names[0]
        assert f"{scheme}-P8-recompute" in names[0]
        assert f"{scheme}-P8-stray-full-save" in names[0]
        assert f"{scheme}-P8-debug-hook" in names[0]
    for P in (1, 2, 4, 8):  # USP: every Ulysses degree U <= P, MHA and GQA (g < U at U = 4)
        for U in (1, 2, 4):
            for kv in (8, 2):
                assert (f"usp-P{P}-U{U}-kv{kv}" in names[0]) == (U <= P)
    for scheme in ("ulysses", "hybrid", "ring", "usp"):
        assert {f"{scheme}-P2-zero3", f"{scheme}-P8-zero3"} <= names[0]
    for name in ("usp-P8-recompute", "usp-P8-stray-full-save", "usp-P8-debug-hook"):
        assert name in names[0]
    assert "megatron-P8-missing-reduce-scatter" in names[0]
    for scheme in ("ring", "usp"):  # the contiguous layout, causal and not; every scheme without the mask
        for P in (2, 8):
            assert {f"{scheme}-P{P}-contiguous", f"{scheme}-P{P}-contiguous-noncausal"} <= names[0]
    assert {f"{scheme}-P8-noncausal" for scheme in ("megatron", "ulysses", "hybrid", "ring", "usp")} <= names[0]
    assert len(names[0]) == 88


def test_loss_and_gradients_match_dense(verify_reports):
    failures = []
    for report in verify_reports:
        for case, errors in report["equivalence"].items():
            # every parameter was compared, plus the loss: 6 tensors per layer, 2 layers
            assert len(errors) == 1 + 6 * 2, (case, sorted(errors))
            worst = max(errors, key=errors.get)
            if errors[worst] > TOL:
                failures.append(f"rank {report['rank']} {case}: {worst} off by {errors[worst]:.2e}")
    assert not failures, "\n".join(failures)
