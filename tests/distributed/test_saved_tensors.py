"""GIVEN profiled steps of the reference models, clean and with injected faults
WHEN the saved-tensor records (sptrace.saved markers from the pack hook) are read per rank
THEN clean runs save only sharded activations, and each fault shows its full-size [B, S, H]
tensor on every rank, in the module it was injected into and nowhere else."""

from __future__ import annotations

import json

import pytest

from tests.suite import world_of
from tests.trace_helpers import read_events, saved_tensors

pytestmark = pytest.mark.distributed

P, L, B, S, H, A, D, F = 8, 2, 2, 128, 96, 16, 6, 160
FULL_SHAPES = {(B, S, H), (S, B, H), (B * S, H)}  # batch-first, sequence-first, flattened
FULL_BYTES = B * S * H * 4


def records(run, rank):
    return [r for r in saved_tensors(read_events(run / f"rank{rank}.pt.trace.json.gz")) if r.kind == "activation"]


def full_size(recs):
    return [r for r in recs if r.shape in FULL_SHAPES]


@pytest.mark.parametrize("name", ["megatron", "ulysses", "hybrid", "megatron-gqa-recompute", "ulysses-zero3-gqa"])
def test_clean_runs_save_only_shards(profiled, name):
    run = profiled(name)
    for rank in range(world_of(name)):
        recs = records(run, rank)
        assert len(recs) > 10 * L
        assert full_size(recs) == []
        assert all(r.storage_nbytes < FULL_BYTES for r in recs), [r for r in recs if r.storage_nbytes >= FULL_BYTES]


def test_megatron_saves_the_input_shard_not_the_gathered_input(profiled):
    recs = records(profiled("megatron"), 0)
    for i in range(L):
        for linear in ("attn.qkv", "mlp.fc1"):
            shapes = {r.shape for r in recs if r.module == f"layers.{i}.{linear}"}
            assert shapes == {(B, S // P, H)}  # SPEC.md §1: the [B, S/P, H] shard
        # tensor-sharded, full sequence: the GeLU output feeding fc2 [B, S, F/P]
        assert (B, S, F // P) in {r.shape for r in recs if r.module == f"layers.{i}.mlp"}


def test_ulysses_saves_head_sharded_attention_inputs(profiled):
    recs = records(profiled("ulysses"), 6)
    core = {r.shape for r in recs if r.module == "layers.0.attn.core"}
    assert (B, A // P, S, D) in core  # q, k, v after the all-to-all: [B, a/P, S, d]
    mlp = {r.shape for r in recs if r.module.startswith("layers.0.mlp")}
    assert mlp and all(S not in shape and B * S not in shape for shape in mlp)  # local tokens only


@pytest.mark.parametrize(
    "name, module, shape",
    [
        ("megatron-stray-full-save", "layers.1.mlp.fc1", (B * S, H)),
        ("ulysses-stray-full-save", "layers.0.mlp.fc1", (B * S, H)),
        ("megatron-missing-reduce-scatter", "layers.1.norm2", (B, S, H)),
        ("hybrid-debug-hook", "layers.0", (B, S, H)),
    ],
)
def test_faults_show_their_full_size_save_on_every_rank(profiled, name, module, shape):
    run = profiled(name)
    info = json.loads((run / "run.json").read_text())
    assert info["config"]["fault_modules"] == [module]
    layer = ".".join(module.split(".")[:2])
    for rank in range(P):
        full = full_size(records(run, rank))
        assert any(r.module == module and r.shape == shape and r.nbytes == FULL_BYTES for r in full), full
        assert all(r.module == layer or r.module.startswith(layer + ".") for r in full)  # nowhere else
