"""GIVEN the real Megatron-Core tensor-parallel layers with sequence parallelism and the real
DeepSpeed-Ulysses DistributedAttention, on 4 gloo ranks, each clean and with one planted stray
full-size save (tests/user_models/frameworks/job.py), profiled over two steps with plain
torch.profiler, and torch's own record of what autograd saved (a saved_tensors_hooks census) and
of the planted tensor's life (a weak reference taken at the forward -> backward boundary)
WHEN `sptrace check` judges each with the flags a user knows (B, S, H, P)
THEN the clean runs PASS, and each stray run FAILs in the planted layer, on the ranks that held it,
in both profiled steps, saying autograd holds it and why."""

from __future__ import annotations

import collections
import gzip
import json
import math

import pytest

from sptrace.cli import main

SCENARIOS = ("megatron_clean", "megatron_stray", "deepspeed_clean", "deepspeed_stray")
CALLS = ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "c10d::alltoall_base_")
COUNTS = {"megatron_clean": (6, 4, 0), "megatron_stray": (5, 4, 0),
          "deepspeed_clean": (0, 0, 16), "deepspeed_stray": (1, 1, 16)}  # fmt: skip
"""Per profiled step and rank: the job's all-gathers, reduce-scatters and all-to-alls (2 layers;
Megatron gathers before fc1 in forward and again in backward, and reduce-scatters fc2's output and
fc1's input gradient; Ulysses moves q, k, v and the context in each direction; the planted
Megatron stray saves the gathered input instead of gathering it again; the DeepSpeed stray's hook
gathers the query once more)."""


def truth(runs, name: str) -> dict:
    return json.loads((runs / name / "truth.json").read_text())


def flags(t: dict) -> list[str]:
    c = t["config"]
    return ["--batch", str(c["B"]), "--seq", str(c["S"]), "--hidden", str(c["H"]), "--sp", str(c["P"])]


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_census_saw_the_planted_stray_and_nothing_else_full_size(framework_runs, name):
    t = truth(framework_runs, name)
    assert t["want_exit"] == int(name.endswith("stray")) and len(t["ranks"]) == t["config"]["P"]
    for rank, record in t["ranks"].items():
        for step in t["profiled_steps"]:
            full = {x["data_ptr"]: x for x in record["full_size_saved"] if x["step"] == step}
            if t["stray"] is None:
                assert not full, (name, rank, full)
                continue
            (saved,) = full.values()  # exactly one full-size storage autograd kept: the planted one
            assert saved["planted"] and saved["module"] == t["stray"]["module"], (name, rank, saved)
            assert saved["storage_nbytes"] == t["config"]["full_activation_bytes"]
        if t["stray"] is not None:  # alive at each boundary, and gone after each backward
            assert record["plant_alive_at_boundary"] == [True, True]
            assert record["plant_freed_after_backward"] == [True, True]


def test_the_strays_are_numerically_harmless(framework_runs):
    for framework in ("megatron", "deepspeed"):
        clean, stray = truth(framework_runs, f"{framework}_clean"), truth(framework_runs, f"{framework}_stray")
        for rank in clean["ranks"]:
            a, b = clean["ranks"][rank]["losses"], stray["ranks"][rank]["losses"]
            assert a == pytest.approx(b, rel=1e-6), (framework, rank)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_traces_hold_the_frameworks_collectives(framework_runs, name):
    t = truth(framework_runs, name)
    for rank in t["ranks"]:
        events = json.loads(gzip.decompress((framework_runs / name / f"rank{rank}.pt.trace.json.gz").read_bytes()))
        counted = collections.Counter(e["name"] for e in events["traceEvents"] if e.get("ph") == "X")
        assert counted["ProfilerStep#1"] == counted["ProfilerStep#2"] == 1
        assert tuple(counted[c] // len(t["profiled_steps"]) for c in CALLS) == COUNTS[name], (name, rank)


@pytest.mark.parametrize("name", SCENARIOS)
def test_check_equals_the_truth(framework_runs, name, capsys, private_cache):
    t = truth(framework_runs, name)
    run = framework_runs / name
    code = main(["check", str(run), "--format", "json", "--cache-dir", str(private_cache), *flags(t)])
    report = json.loads(capsys.readouterr().out)
    assert code == t["want_exit"], report["verdict"]
    coverage = report["coverage"]
    assert coverage["ranks"] == coverage["memory_events"] == list(range(t["config"]["P"]))
    assert coverage["steps"] == t["profiled_steps"] and coverage["layers"] == list(range(t["config"]["layers"]))
    if t["stray"] is None:
        assert report["verdict"]["status"] == "pass" and not report["findings"]
        return
    layer = t["stray"]["layer"]
    found = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert found and {f["layer"] for f in found} == {layer}, [f["message"] for f in found]
    assert {r for f in found for r in f["ranks"]} == {int(r) for r in t["ranks"]}  # every rank held it
    # the stray of each step, at its own boundary: one finding per tensor, every boundary listed
    assert all({b["step"] for b in f["boundaries"]} == set(t["profiled_steps"]) for f in found)
    assert all(f["holder"] == "autograd" and f["evidence"].startswith("freed in") for f in found)
    shapes = [f["message"].split("[")[1].split("]")[0] for f in found]
    elements = {math.prod(int(d) for d in s.split("x")) for s in shapes}
    assert elements == {t["config"]["full_activation_numel"]}
