"""Collective counts per step, phase and module, counted in-process with CommDebugMode (as
torchtitan's tests do) at P = 8, L = 2, against SPEC.md §1."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.distributed

L = 2
AG, RS, A2A, AR = "_allgather_base_", "_reduce_scatter_base_", "alltoall_base_", "allreduce_"

# SPEC.md §1, per layer. megatron with g < P adds the QKV last-dim all-gather / reduce-scatter.
EXPECTED = {
    "megatron-kv8": ({AG: 2, RS: 2}, {AG: 4, RS: 2}),
    "megatron-kv2": ({AG: 3, RS: 2}, {AG: 4, RS: 3}),
    "ulysses-kv8": ({A2A: 4}, {A2A: 4}),
    "ulysses-kv2": ({A2A: 4}, {A2A: 4}),
    "hybrid-kv8": ({A2A: 4, AG: 1, RS: 1}, {A2A: 4, AG: 2, RS: 1}),
    "hybrid-kv2": ({A2A: 4, AG: 1, RS: 1}, {A2A: 4, AG: 2, RS: 1}),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_counts_per_phase(verify_reports, case):
    fwd, bwd = EXPECTED[case]
    for report in verify_reports:
        got = report["collectives"][case]
        assert got["forward"] == {op: n * L for op, n in fwd.items()}
        assert got["backward"] == {op: n * L for op, n in bwd.items()}
        # one coalesced all-reduce of the replicated parameters' gradients after backward
        assert got["grad_sync"] == {AR: 1}


@pytest.mark.parametrize("scheme", ["megatron", "hybrid"])
def test_forward_counts_per_module(verify_reports, scheme):
    modules = verify_reports[3]["collectives"][f"{scheme}-kv8"]["forward_modules"]
    for i in range(L):
        prefix = f"SPTransformer.layers.{i}"
        assert modules[f"{prefix}.mlp.fc1|forward"] == {AG: 1}
        assert modules[f"{prefix}.mlp.fc2|forward"] == {RS: 1}
        if scheme == "megatron":
            assert modules[f"{prefix}.attn.qkv|forward"] == {AG: 1}
            assert modules[f"{prefix}.attn.proj|forward"] == {RS: 1}
        else:
            assert modules[f"{prefix}.attn|forward"] == {A2A: 4}


@pytest.mark.parametrize("kv", [8, 2])
def test_ring_point_to_point_per_layer(verify_reports, kv):
    """Ring attention, counted by wrapping torch.distributed.isend/irecv (CommDebugMode does not
    see point-to-point ops). TransformerEngine's AttnFuncWithCPAndKVP2P: in forward, P-1 K,V
    blocks go to rank r+1 per layer; in backward they go the reverse way, first K,V alone, then
    K,V with the previous step's dK,dV, last dK,dV alone. The bytes follow from the tensors:
    a block is K and V of this rank's tokens, [2, B, S/P, g, d] in fp32."""
    P = len(verify_reports)
    B, S, d = 2, 32, 8  # verify.BASE
    block = 2 * B * (S // P) * kv * d * 4
    for report in verify_reports:
        r = report["rank"]
        got = report["collectives"][f"ring-kv{kv}"]
        assert got["forward"] == {} and got["backward"] == {}  # attention needs no collective
        assert got["grad_sync"] == {AR: 1}  # the replicated weights' gradients
        p2p = got["p2p"]
        forward = [(c["op"], c["peer"], c["bytes"]) for c in p2p["forward"]]
        assert forward == [("isend", (r + 1) % P, block), ("irecv", (r - 1) % P, block)] * ((P - 1) * L)
        backward = [(c["op"], c["peer"], c["bytes"]) for c in p2p["backward"]]
        sizes = [block] + [2 * block] * (P - 2) + [block]
        assert [b for op, _, b in backward if op == "isend"] == sizes * L
        assert [b for op, _, b in backward if op == "irecv"] == sizes * L
        assert {peer for op, peer, _ in backward if op == "isend"} == {(r - 1) % P}
        assert {peer for op, peer, _ in backward if op == "irecv"} == {(r + 1) % P}
        assert p2p["grad_sync"] == []


@pytest.mark.parametrize("kv", [8, 2])
def test_usp_all_to_alls_and_ring_per_layer(verify_reports, kv):
    """USP with U = 2 at P = 8: Ulysses' four all-to-alls each way inside pairs of neighbouring
    ranks, and the ring across the P/U = 4 pairs, on [B, S*U/P] tokens of g/U kv heads each."""
    P, U = len(verify_reports), 2
    R = P // U
    B, S, d = 2, 32, 8
    block = 2 * B * (S // R) * max(kv // U, 1) * d * 4
    for report in verify_reports:
        r = report["rank"]
        j, u = divmod(r, U)
        got = report["collectives"][f"usp-kv{kv}"]
        assert got["forward"] == {A2A: 4 * L} and got["backward"] == {A2A: 4 * L}
        p2p = got["p2p"]
        following, preceding = ((j + 1) % R) * U + u, ((j - 1) % R) * U + u  # ring neighbours
        forward = [(c["op"], c["peer"], c["bytes"]) for c in p2p["forward"]]
        assert forward == [("isend", following, block), ("irecv", preceding, block)] * ((R - 1) * L)
        sizes = [block] + [2 * block] * (R - 2) + [block]
        backward = [(c["op"], c["peer"], c["bytes"]) for c in p2p["backward"]]
        assert [b for op, _, b in backward if op == "isend"] == sizes * L
        assert {peer for op, peer, _ in backward if op == "isend"} == {preceding}
