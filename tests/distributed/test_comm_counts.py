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
