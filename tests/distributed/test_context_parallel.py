"""GIVEN ring attention (zigzag layout, and causal over contiguous chunks) and USP (Ulysses over
pairs of ranks, a ring across the pairs) profiled on 8 gloo ranks
WHEN sptrace analyzes and checks the runs
THEN every send pairs with its receive, hop by hop as TransformerEngine's schedule has them,
with the bytes of the K,V blocks the models hold; the cost model matches to the byte; the
activations stay sequence-sharded, and a stray full-size save fails the check; analyze names the
contiguous ring's imbalance (rank P-1, 2P/(P+1) of the mean attention work) and says the zigzag
ring is balanced."""

from __future__ import annotations

import json

import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.analysis import analyse_run
from sptrace.cli import main
from tests.suite import world_of

pytestmark = pytest.mark.distributed

P = 8
CFG = StepConfig()  # the runs use the reference model's defaults
L, B, S, G, D = CFG.layers, CFG.batch, CFG.seq, CFG.kv_heads, CFG.head_dim
FP32 = 4


@pytest.fixture(scope="module")
def ring(profiled, private_cache):
    return analyse_run(profiled("ring"), load_options={"cache_dir": private_cache})


@pytest.fixture(scope="module")
def usp(profiled, private_cache):
    return analyse_run(profiled("usp"), load_options={"cache_dir": private_cache})


@pytest.fixture(scope="module")
def contiguous(profiled, private_cache):
    return analyse_run(profiled("ring-contiguous"), load_options={"cache_dir": private_cache})


def test_analyze_names_the_unbalanced_causal_ring_and_says_zigzag_is_balanced(contiguous, ring, capsys):
    predicted = 2 * P / (P + 1)  # docs/balance.md: rank P-1 computes P of the mean (P+1)/2 blocks
    balance = contiguous.balance
    assert balance is not None and balance.work_recorded and len(balance.rows) == 2  # one layer, fwd and bwd
    assert [c.code for c in balance.causes] == ["causal-mask"], balance.line()
    cause = balance.causes[0]
    assert cause.ranks == (P - 1,) and abs(cause.ratio / predicted - 1) <= 0.15, cause.text
    assert set(balance.rows["attention_rank"]) == {P - 1}
    assert (balance.rows["attention_ratio"] / predicted - 1).abs().max() <= 0.15
    assert ring.balance is not None and ring.balance.balanced, ring.balance.line()
    assert ring.balance.rows["attention_ratio"].max() <= 1.05
    # the command says it, with the rank and the ratio
    assert main(["analyze", str(contiguous.path), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert f"imbalanced: rank {P - 1} computes {cause.ratio:.2f}x the mean attention work" in out
    assert "--cp-balance zigzag" in out
    assert main(["analyze", str(ring.path), "--no-cache"]) == 0
    assert "  balanced: equal work on every rank" in capsys.readouterr().out


def test_ring_hops_follow_transformer_engines_schedule(ring):
    block = 2 * B * (S // P) * G * D * FP32  # K and V of one rank's tokens
    pairs = ring.p2p.pairs
    assert ring.p2p.unpaired.empty and not pairs["peer_disagrees"].any()
    fwd, bwd = pairs[pairs["phase"] == "forward"], pairs[pairs["phase"] == "backward"]
    # forward: P-1 steps per layer, each rank to the next
    assert len(fwd) == L * (P - 1) * P and set(fwd["bytes"]) == {block}
    assert set(zip(fwd["src"], fwd["dst"])) == {(r, (r + 1) % P) for r in range(P)}
    # backward, the other way: K,V alone, then K,V with dK,dV, last dK,dV alone
    assert len(bwd) == L * P * P
    assert set(zip(bwd["src"], bwd["dst"])) == {(r, (r - 1) % P) for r in range(P)}
    sizes = bwd.groupby("step")["bytes"].unique().map(lambda v: sorted(v))
    assert sizes.to_dict() == {s: [block if s in (0, P - 1) else 2 * block] for s in range(P)}
    steps = ring.p2p.steps
    assert len(steps) == L * (2 * P - 1) and set(steps["hops"]) == {P}
    assert steps["overlap"].between(0, 1).all() and ring.p2p.imbalance() >= 1.0


def test_ring_matches_its_cost_model_and_keeps_activations_sharded(ring):
    assert ring.comm is not None and ring.comm.verdict.exit_code == 0, ring.comm.verdict.line()
    per_rank = ring.collectives[ring.collectives["kind"] == "send"].groupby("rank")["wire_bytes"].sum()
    expected = ring.estimate.wire_per_step(kind="send")
    assert set(per_rank) == {expected}
    assert ring.sharding is not None and ring.sharding.verdict.exit_code == 0
    # the ring saves the final softmax log-sum-exp, [B, a, S/P] fp32, beside q, K,V and the output
    saved = {tuple(r.shape or ()) for ret in ring.retained for r in ret.tensors.itertuples() if r.layer == 0}
    assert (B, CFG.heads, S // P) in saved


def test_usp_rings_stay_inside_ulysses_positions(usp):
    U, R = 2, P // 2
    pairs = usp.p2p.pairs
    assert usp.p2p.unpaired.empty and not pairs["peer_disagrees"].any()
    fwd = pairs[pairs["phase"] == "forward"]
    # ring rank j of Ulysses position u is global rank j*U + u: the ring links j to j+1
    assert set(zip(fwd["src"], fwd["dst"])) == {(j * U + u, ((j + 1) % R) * U + u) for j in range(R) for u in range(U)}
    block = 2 * B * (S // R) * max(G // U, 1) * D * FP32
    assert len(fwd) == L * (R - 1) * P and set(fwd["bytes"]) == {block}
    a2a = usp.collectives[usp.collectives["kind"] == "all_to_all"]
    assert len(a2a) == P * L * 8  # four each way per layer
    # c10d::alltoall_base_ records no group, and each rank is in three (the world, its Ulysses
    # pair, its ring): the reference model's marker names the group's size, U, on every one
    assert len(a2a) and (a2a["group_size"] == U).all()
    assert a2a["source"].str.contains("group size: sptrace.comm marker").all()
    assert usp.comm is not None and usp.comm.verdict.exit_code == 0, usp.comm.verdict.line()


def test_ring_stray_full_save_fails_the_check(profiled, capsys):
    code = main(["check", str(profiled("ring-stray-full-save")), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    full = [f for f in out["findings"] if f["code"] == "full-size-save"]
    assert full and all(f["module"].endswith("mlp.fc1") or f["module"].endswith("mlp") for f in full)


def test_analyze_prints_the_ring_steps(profiled, capsys):
    code = main(["analyze", str(profiled("ring"))])
    out = capsys.readouterr().out
    assert code == 0
    pairs = L * (P - 1) * P + L * P * P
    assert f"point-to-point: {pairs} sends paired with their receives, 0 unpaired" in out


def test_ring_with_selective_recompute_matches_its_model(profiled, private_cache):
    """GQA (g = 2 kv heads travel unreplicated) and the checkpointed ring, whose forward ring runs
    again in backward: the backward's first P-1 sends go to rank r+1, with K,V blocks."""
    a = analyse_run(profiled("ring-gqa-recompute"), load_options={"cache_dir": private_cache})
    assert a.comm is not None and a.comm.verdict.exit_code == 0, a.comm.verdict.line()
    P = world_of("ring-gqa-recompute")
    block = 2 * B * (S // P) * 2 * D * FP32
    bwd = a.p2p.pairs[a.p2p.pairs["phase"] == "backward"]
    forward_again = bwd[bwd["dst"] == (bwd["src"] + 1) % P]
    assert len(forward_again) == L * (P - 1) * P and set(forward_again["bytes"]) == {block}
    assert a.sharding is not None and a.sharding.verdict.exit_code == 0
