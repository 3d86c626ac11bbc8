"""GIVEN `sptrace profile` runs of each scheme on 8 gloo ranks (default model: L=2, B=2, S=128,
H=96, a=16, g=8, d=6, F=160, fp32)
WHEN their Kineto traces are read back
THEN every rank shows SPEC.md §1's collectives per layer and phase with the right shapes, the
markers sptrace promises, and run.json describes the run."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.trace_helpers import collectives, read_events

pytestmark = pytest.mark.distributed

P, L, B, S, H, A, G, D, F = 8, 2, 2, 128, 96, 16, 8, 6, 160
AG, RS, A2A, AR = "c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_", "c10d::allreduce_"
GATHER = [[S, B, H], [S // P, B, H]]  # Input Dims: output, then input (SPEC.md §4)
SCATTER = [[S // P, B, H], [S, B, H]]


def per_layer(colls, layer, phase):
    return Counter(c.op for c in colls if c.layer == layer and c.phase == phase)


def test_megatron_collectives_per_layer_and_phase(profiled):
    run = profiled("megatron")
    for rank in range(P):
        colls = collectives(read_events(run / f"rank{rank}.pt.trace.json.gz"))
        for i in range(L):
            assert per_layer(colls, i, "forward") == {AG: 2, RS: 2}
            assert per_layer(colls, i, "backward") == {AG: 4, RS: 2}
            roles = [(c.module, c.role) for c in colls if c.layer == i]
            assert (
                roles
                == [  # SPEC.md §1 rows 1-4, then 5-10 in backward order
                    (f"layers.{i}.attn.qkv", "ag_fwd"),
                    (f"layers.{i}.attn.proj", "rs_fwd"),
                    (f"layers.{i}.mlp.fc1", "ag_fwd"),
                    (f"layers.{i}.mlp.fc2", "rs_fwd"),
                    (f"layers.{i}.mlp.fc2", "ag_bwd"),
                    (f"layers.{i}.mlp.fc1", "ag_input_bwd"),
                    (f"layers.{i}.mlp.fc1", "rs_bwd"),
                    (f"layers.{i}.attn.proj", "ag_bwd"),
                    (f"layers.{i}.attn.qkv", "ag_input_bwd"),
                    (f"layers.{i}.attn.qkv", "rs_bwd"),
                ][: len(roles)]
                and len(roles) == 10
            )
        for c in colls:
            if c.op == AG and c.layer is not None:
                assert c.dims[:2] == GATHER
            if c.op == RS:
                assert c.dims[:2] == SCATTER
        (sync,) = [c for c in colls if c.op == AR]
        assert sync.module == "grad_sync" and sync.phase == "backward"
        assert sync.dims[0] == [[2 * L * H]]  # the norm weights of every layer, coalesced


def test_ulysses_all_to_alls(profiled):
    run = profiled("ulysses")
    for rank in range(P):
        colls = collectives(read_events(run / f"rank{rank}.pt.trace.json.gz"))
        assert Counter(c.op for c in colls) == {A2A: 8 * L, AR: 1}
        for i in range(L):
            assert per_layer(colls, i, "forward") == {A2A: 4}
            assert per_layer(colls, i, "backward") == {A2A: 4}
            fwd = [c for c in colls if c.layer == i and c.phase == "forward"]
            assert [c.role for c in fwd] == ["q::a2a_fwd", "k::a2a_fwd", "v::a2a_fwd", "context::a2a_fwd"]
            # pieces [P, B, S/P, heads/P, d]: q has a/P = 2 heads per rank, k and v g/P = 1
            assert [c.dims[0] for c in fwd] == [[P, B, S // P, A // P, D]] + [[P, B, S // P, G // P, D]] * 2 + [
                [P, B, S // P, A // P, D]
            ]
        (sync,) = [c for c in colls if c.op == AR]
        per_layer_params = 2 * H + (A + 2 * G) * D * H + A * D * H + 2 * F * H
        assert sync.dims[0] == [[L * per_layer_params]]  # every weight, one fp32 bucket


def test_hybrid_mixes_all_to_all_and_megatron_mlp(profiled):
    run = profiled("hybrid")
    colls = collectives(read_events(run / "rank5.pt.trace.json.gz"))
    for i in range(L):
        assert per_layer(colls, i, "forward") == {A2A: 4, AG: 1, RS: 1}
        assert per_layer(colls, i, "backward") == {A2A: 4, AG: 2, RS: 1}
    (sync,) = [c for c in colls if c.op == AR]
    assert sync.dims[0] == [[L * (2 * H + (A + 2 * G) * D * H + A * D * H)]]  # attention + norms


def test_megatron_gqa_below_p_adds_last_dim_gather(profiled):
    run = profiled("megatron-gqa-recompute")  # g = 2 < P = 4
    colls = collectives(read_events(run / "rank0.pt.trace.json.gz"))
    for i in range(L):
        assert per_layer(colls, i, "forward") == {AG: 3, RS: 2}
        assert per_layer(colls, i, "backward") == {AG: 4, RS: 3}
    qkv_out = (A + 2 * 2) * D  # grouped QKV width
    last = [c for c in colls if c.role in ("ag_last_fwd", "rs_last_bwd")]
    assert len(last) == 2 * L
    assert all(c.dims[0] == [qkv_out, B, S] for c in last if c.op == AG)


def test_zero3_gathers_parameters_instead_of_all_reduce(profiled):
    run = profiled("ulysses-zero3-gqa")
    colls = collectives(read_events(run / "rank2.pt.trace.json.gz"))
    ops = Counter(c.op for c in colls)
    assert AR not in ops
    assert ops[A2A] == 8 * L
    # FSDP2 with reshard_after_forward: one gather per block in forward, one in backward, and
    # one gradient reduce-scatter per block (DeepSpeed's k = 2)
    assert ops[AG] == 2 * L and ops[RS] == L
    gathers = [c for c in colls if c.op == AG]
    assert [c.phase for c in gathers].count("forward") == L
    # instrument() runs after fully_shard with prepended hooks: the forward gathers fall
    # inside their block's module range
    assert [c.module for c in gathers if c.phase == "forward"] == [f"layers.{i}" for i in range(L)]
    params_per_layer = 2 * H + (A + 2 * 2) * D * H + A * D * H + 2 * F * H
    assert all(c.dims[0] == [params_per_layer] for c in gathers)  # the whole block's weights


def test_markers_and_run_json(profiled):
    run = profiled("megatron")
    info = json.loads((run / "run.json").read_text())
    assert info["world_size"] == P and info["backend"] == "gloo" and info["device"] == "cpu"
    assert info["traces"] == [f"rank{r}.pt.trace.json.gz" for r in range(P)]
    cfg = info["config"]
    assert (cfg["scheme"], cfg["sp_size"], cfg["layers"], cfg["seq"], cfg["hidden"]) == ("megatron", P, L, S, H)
    assert cfg["fault"] is None and cfg["fault_modules"] == []
    assert info["torch_version"].startswith("2.")
    events = read_events(run / "rank3.pt.trace.json.gz")
    names = Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
    assert names["ProfilerStep#1"] == 1
    for phase in ("forward", "backward", "optimizer"):
        assert names[f"sptrace.phase::{phase}"] == 1
    for i in range(L):
        for module in (
            "",
            ".norm1",
            ".attn",
            ".attn.qkv",
            ".attn.core",
            ".attn.proj",
            ".norm2",
            ".mlp.fc1",
            ".mlp.fc2",
        ):
            assert names[f"sptrace.module::layers.{i}{module}"] == 1
    assert sum(1 for e in events if e.get("name") == "[memory]") > 100
    assert any(e.get("cat") == "python_function" for e in events)
    assert any(e.get("args", {}).get("Input Dims") for e in events if e.get("cat") == "cpu_op")
