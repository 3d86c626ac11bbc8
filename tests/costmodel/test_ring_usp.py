"""The cost model of ring attention and USP against hand-derived P2P schedules, all-to-all shapes
and activation bytes (P=8, L=2, B=2, S=32, H=64, a=8, d=8, F=96, float32)."""

from __future__ import annotations

import pytest

from sptrace.costmodel import activation_bytes_per_layer, estimate_comm
from sptrace.vocab.errors import UsageError
from sptrace.vocab.shape import ModelShape

B, S, H, a, d, b, L = 2, 32, 64, 8, 8, 4, 2


def shape(scheme: str, *, P: int = 8, g: int = 8, U: int | None = None, **changes) -> ModelShape:
    values = dict(
        scheme=scheme, zero3=False, sp_size=P, layers=L, batch=B, seq=S, hidden=H, heads=a, kv_heads=g, ffn=96,
        dtype="float32", recompute="none", grad_bucket_mib=25, ulysses_degree=U,
    )  # fmt: skip
    return ModelShape(**{**values, **changes})


def layer(est, phase: str) -> list:
    return [c for c in est.collectives if c.per_layer and c.phase == phase]


def p2p(est, phase: str) -> list:
    return [c for c in layer(est, phase) if c.kind in ("send", "recv")]


def ring_schedule(R: int, N: int) -> tuple[list[int], list[int]]:
    """Bytes of each step's send (and its recv), forward and backward, for a ring of R ranks."""
    if R == 1:
        return [], []
    return [N] * (R - 1), [N] + [2 * N] * (R - 2) + [N]


def fields(c) -> tuple:
    return c.phase, c.kind, c.module, c.in_shape, c.out_shape, c.in_bytes, c.out_bytes, c.group_size, c.per_layer


# ---- ring ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("g, N", [(8, 2 * 2 * 4 * 8 * 8 * 4), (2, 2 * 2 * 4 * 2 * 8 * 4)])
def test_ring_p2p_schedule(g, N):
    est = estimate_comm(shape("ring", g=g))
    assert est.scheme == "ring"
    fwd, bwd = ring_schedule(8, N)
    assert fwd == [N] * 7 and bwd == [N, 2 * N, 2 * N, 2 * N, 2 * N, 2 * N, 2 * N, N]
    block = (2, B, S // 8, g, d)  # kv heads travel unreplicated
    for phase, sizes in (("forward", fwd), ("backward", bwd)):
        specs = layer(est, phase)
        assert specs == p2p(est, phase)  # nothing but P2P in the layer
        assert [c.kind for c in specs] == ["send", "recv"] * len(sizes)
        assert [c.in_bytes for c in specs[::2]] == sizes and [c.in_bytes for c in specs[1::2]] == sizes
        assert {c.group_size for c in specs} == {8} and {c.module for c in specs} == {"attn"}
        assert all(c.in_shape == c.out_shape for c in specs)
        assert est.wire_per_layer(phase=phase) == sum(sizes)  # a send's wire bytes are its own, a recv's 0
    assert {c.in_shape for c in p2p(est, "forward")} == {block}
    shapes = [c.in_shape for c in p2p(est, "backward")[::2]]
    assert shapes == [block] + [(2, *block)] * 6 + [block]
    assert est.count("send") == est.count("recv") == L * (7 + 8)
    assert est.count("all_to_all") == est.count("all_gather") == est.count("reduce_scatter") == 0


def test_ring_one_rank_has_no_p2p():
    est = estimate_comm(shape("ring", P=1))
    assert est.collectives == ()


def test_ring_grad_sync_as_ulysses():
    # per layer: norm1 64, qkv (8 + 2*8)*8*64, proj 64*64, norm2 64, fc1 96*64, fc2 64*96
    per_layer = 64 + 24 * 8 * 64 + 64 * 64 + 64 + 2 * 96 * 64
    est = estimate_comm(shape("ring"))
    steps = [c for c in est.collectives if not c.per_layer]
    assert [(c.kind, c.in_bytes, c.group_size) for c in steps] == [("all_reduce", L * per_layer * 4, 8)]
    ulysses = estimate_comm(shape("ulysses"))
    assert [fields(c) for c in steps] == [fields(c) for c in ulysses.collectives if not c.per_layer]


def test_ring_grad_buckets_in_reverse_parameter_order():
    est = estimate_comm(shape("ring", grad_bucket_mib=0.001))  # 1048 bytes: one bucket per gradient
    buckets = [c.in_bytes for c in est.collectives if c.kind == "all_reduce"]
    fc2, fc1, norm2, proj, qkv, norm1 = 64 * 96 * 4, 96 * 64 * 4, 64 * 4, 64 * 64 * 4, 24 * 8 * 64 * 4, 64 * 4
    assert buckets == [fc2, fc1, norm2, proj, qkv, norm1] * L


def test_ring_zero3_shards_the_block():
    per_layer = 64 + 24 * 8 * 64 + 64 * 64 + 64 + 2 * 96 * 64  # every module divisible by P=8: no padding
    est = estimate_comm(shape("ring", zero3=True))
    assert est.scheme == "ring-zero3"
    z = [c for c in est.collectives if c.kind in ("all_gather", "reduce_scatter")]
    assert [(c.phase, c.kind, c.module, c.in_bytes, c.out_bytes) for c in z] == [
        ("forward", "all_gather", "block", per_layer // 8 * 4, per_layer * 4),
        ("backward", "all_gather", "block", per_layer // 8 * 4, per_layer * 4),
        ("backward", "reduce_scatter", "block", per_layer * 4, per_layer // 8 * 4),
    ]
    assert est.count("all_reduce") == 0
    ulysses = estimate_comm(shape("ulysses", zero3=True))
    assert [fields(c) for c in z] == [fields(c) for c in ulysses.collectives if c.module == "block"]


# ---- usp -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "U, g, q_out, kv_in, kv_out, ring_kv",
    [
        # U=2, R=4: q [B, S/P, a, d] -> [B, S/R, a/U, d]; k, v 8 heads -> 4; the ring carries 4 kv heads
        (2, 8, (B, 8, 4, d), (B, 4, 8, d), (B, 8, 4, d), 4),
        # U=4, R=2, g=2 < U: kv heads replicated to 4 before the all-to-all, one per rank after it
        (4, 2, (B, 16, 2, d), (B, 4, 4, d), (B, 16, 1, d), 1),
    ],
)
def test_usp_schedule(U, g, q_out, kv_in, kv_out, ring_kv):
    R = 8 // U
    est = estimate_comm(shape("usp", g=g, U=U))
    assert est.scheme == "usp"
    q_in, tokens = (B, S // 8, a, d), S // R
    N = 2 * B * tokens * ring_kv * d * b
    fwd, bwd = ring_schedule(R, N)
    block = (2, B, tokens, ring_kv, d)

    forward = layer(est, "forward")
    a2a = [(c.in_shape, c.out_shape, c.group_size) for c in forward if c.kind == "all_to_all"]
    assert a2a == [(q_in, q_out, U), (kv_in, kv_out, U), (kv_in, kv_out, U), (q_out, q_in, U)]
    # execution order: q, k, v all-to-alls, the ring, then the context's all-to-all
    assert [c.kind for c in forward] == ["all_to_all"] * 3 + ["send", "recv"] * len(fwd) + ["all_to_all"]
    assert [c.in_bytes for c in p2p(est, "forward")[::2]] == fwd
    assert {(c.in_shape, c.group_size) for c in p2p(est, "forward")} == {(block, R)}

    backward = layer(est, "backward")
    a2a = [(c.in_shape, c.out_shape, c.group_size) for c in backward if c.kind == "all_to_all"]
    assert a2a == [(q_in, q_out, U), (kv_out, kv_in, U), (kv_out, kv_in, U), (q_out, q_in, U)]  # context, v, k, q
    assert [c.kind for c in backward] == ["all_to_all"] + ["send", "recv"] * len(bwd) + ["all_to_all"] * 3
    assert [c.in_bytes for c in p2p(est, "backward")[1::2]] == bwd
    assert {c.group_size for c in p2p(est, "backward")} == {R}
    if g < U:
        assert any("replicated from 2 to 4" in n for n in est.notes)


def test_usp_with_U_equal_P_is_ulysses():
    for g in (8, 2):
        usp, ulysses = estimate_comm(shape("usp", g=g, U=8)), estimate_comm(shape("ulysses", g=g))
        assert usp.count("send") == usp.count("recv") == 0
        assert [fields(c) for c in usp.collectives] == [fields(c) for c in ulysses.collectives]
        assert usp.count("all_to_all") == L * 8


def test_usp_with_U_1_is_ring():
    for g in (8, 2):
        usp, ring = estimate_comm(shape("usp", g=g, U=1)), estimate_comm(shape("ring", g=g))
        assert usp.count("all_to_all") == 0
        assert [fields(c) for c in usp.collectives] == [fields(c) for c in ring.collectives]
        assert usp.count("send") == L * (7 + 8)


def test_usp_zero3_label():
    assert estimate_comm(shape("usp", U=2, zero3=True)).scheme == "usp-zero3"


# ---- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, message",
    [
        (shape("ring", seq=24), "seq 24 is not divisible by 2P=16"),
        (shape("usp", U=3), "Ulysses degree 3 does not divide the sequence-parallel size 8"),
        (shape("usp", U=8, heads=4, kv_heads=4), "heads 4 is not divisible by the Ulysses degree 8"),
        (shape("usp", U=4, hidden=96, heads=12, kv_heads=6), "kv heads 6 and the Ulysses degree 4"),
        (shape("usp", U=1, seq=24), "seq 24 is not divisible by 2R=16"),
    ],
)
def test_divisibility_errors(cfg, message):
    with pytest.raises(UsageError, match=message):
        estimate_comm(cfg)


def test_ring_needs_no_heads_divisible_by_P():
    est = estimate_comm(shape("ring", P=16, heads=8))  # 8 heads on 16 ranks: heads stay whole
    assert est.count("send") == L * (15 + 16)


def test_usp_needs_the_ulysses_degree():
    with pytest.raises(UsageError, match="--ulysses-degree") as err:
        estimate_comm(shape("usp"))
    assert "\n" not in str(err.value)


# ---- activations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme, U", [("ring", None), ("usp", 2)])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_activation_bytes_flash_style(scheme, U, recompute):
    # 34*S*B*H/P, no 5*a*S/H score term, plus the fp32 log-sum-exp a*S*B/P*4
    expected = 34 * 32 * 2 * 64 / 8 + 8 * 32 * 2 / 8 * 4
    assert expected == 17664
    assert activation_bytes_per_layer(shape(scheme, U=U, recompute=recompute)) == expected


def test_activation_bytes_other_schemes_unchanged():
    assert activation_bytes_per_layer(shape("ulysses")) == 32 * 2 * 64 / 8 * (34 + 5 * 8 * 32 / 64)


@pytest.mark.parametrize("scheme, U, R, tokens, kv", [("ring", None, 8, S // 8, 8), ("usp", 2, 4, S // 4, 4)])
def test_selective_recompute_runs_the_forward_ring_again_in_backward(scheme, U, R, tokens, kv):
    """The checkpointed ring attention reruns its forward ring (R-1 blocks to rank r+1) at the
    start of its backward, before the backward ring."""
    N = 2 * B * tokens * kv * d * b
    plain = estimate_comm(shape(scheme, U=U))
    again = estimate_comm(shape(scheme, U=U, recompute="selective"))
    sends = [c for c in p2p(again, "backward") if c.kind == "send"]
    fwd, bwd = ring_schedule(R, N)
    assert [c.in_bytes for c in sends] == fwd + bwd
    assert all("recomputed" in c.what and "r+1" in c.what for c in sends[: R - 1])
    assert p2p(again, "forward") == p2p(plain, "forward")
    assert again.count("send") == plain.count("send") + L * (R - 1)
