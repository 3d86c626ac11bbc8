"""GIVEN profiled reference runs (8 gloo ranks), clean and with communication faults
WHEN sptrace analyze compares their collectives with the cost model
THEN clean runs match with measured wire bytes equal to the model's, and each fault is reported
in the right layer, phase and module on every rank."""

from __future__ import annotations

import json

import pytest

from sptrace.cli import main
from tests.suite import world_of

pytestmark = pytest.mark.distributed

KiB = 1024
SHARD = 2 * 16 * 96 * 4  # [B, S/P, H] fp32 = 12 KiB
FULL = 8 * SHARD


def analyze(path, capsys, *flags):
    code = main(["analyze", str(path), "--format", "json", *flags])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "name", ["megatron", "ulysses", "hybrid", "megatron-gqa-recompute", "ulysses-zero3-gqa", "hybrid-zero3"]
)
def test_clean_runs_match_the_model(profiled, capsys, private_cache, name):
    code, report = analyze(profiled(name), capsys)
    assert code == 0 and report["match"] and report["findings"] == []
    world = world_of(name)
    assert len(report["ranks"]) == world
    for r in report["ranks"]:
        assert r["observed"] == r["expected"]
        assert r["observed_wire_bytes"] == pytest.approx(r["expected_wire_bytes"], rel=1e-12)
    assert all(layer["observed"] == layer["expected"] for layer in report["layers"])
    matched = report["matched_collectives"]
    assert len(matched) == report["ranks"][0]["observed"] and all(m["n_ranks"] == world for m in matched)
    assert sorted(map(int, report["clock_offsets_us"])) == list(range(world))


def codes(report, rank):
    return sorted(
        (f["code"], f["layer"], f["message"].split(": ", 1)[1]) for f in report["findings"] if rank in f["ranks"]
    )


def test_stray_full_save_skips_the_backward_regather(profiled, capsys):
    code, report = analyze(profiled("megatron-stray-full-save"), capsys)
    assert code == 1 and not report["match"]
    for rank in range(8):
        # ColwiseParallel keeps the gathered input, so fc1's backward all-gather of its shard is gone
        assert codes(report, rank) == [("missing-collective", 1, "missing all_gather of 12.00 KiB")]
    # the same fact on every rank is one finding with its rank set
    (finding,) = report["findings"]
    assert finding["ranks"] == list(range(8)) and report["verdict"]["status"] == "fail"


def test_missing_reduce_scatter_is_an_all_reduce(profiled, capsys):
    code, report = analyze(profiled("megatron-missing-reduce-scatter"), capsys)
    assert code == 1
    for rank in (0, 7):
        found = codes(report, rank)
        assert ("missing-collective", 1, "missing reduce_scatter of 96.00 KiB") in found
        assert any(c == "extra-collective" and layer == 1 and "all_reduce of 96.00 KiB" in m for c, layer, m in found)
    modules = {f["module"] for f in report["findings"] if f["code"] == "extra-collective"}
    assert "layers.1.mlp.fc2" in modules


def test_debug_hook_adds_a_forward_all_gather(profiled, capsys):
    code, report = analyze(profiled("hybrid-debug-hook"), capsys)
    assert code == 1
    for rank in range(8):
        assert codes(report, rank) == [("extra-collective", 0, "unexpected all_gather of 12.00 KiB from layers.0")]


def test_ulysses_gathered_mlp_input(profiled, capsys):
    code, report = analyze(profiled("ulysses-stray-full-save"), capsys)
    assert code == 1
    found = codes(report, 4)
    assert ("extra-collective", 0, "unexpected all_gather of 12.00 KiB from layers.0.mlp.fc1") in found
    assert ("extra-collective", 0, "unexpected reduce_scatter of 96.00 KiB from layers.0.mlp.fc1") in found


def test_analyze_text_and_usage_errors(profiled, capsys, corpus, tmp_path):
    assert main(["analyze", str(profiled("megatron"))]) == 0
    out = capsys.readouterr().out
    assert "MATCH: 21 collectives and 1.64 MiB on the wire per rank, as the megatron model predicts" in out
    assert "largest arrival skew" in out and "comm ms" in out
    # a foreign run that declares no model: its ranks compared with each other, and it says why no more
    assert main(["analyze", str(corpus / "param_dlrm_kineto"), "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the cost-model comparison was skipped" in out and "needs --scheme, --sp, --layers, --batch, --seq" in out
    assert "CONSISTENT: 8 collectives per rank" in out
    # a foreign run checked against a scheme it does not follow: a mismatch, not a crash
    model = ["--scheme", "ulysses", "--layers", "1", "--batch", "1", "--seq", "1024", "--hidden", "64", "--heads", "8",
             "--kv-heads", "8", "--ffn", "64", "--dtype", "float32", "--sp", "8"]  # fmt: skip
    code = main(["analyze", str(corpus / "param_dlrm_kineto"), *model, "--cache-dir", str(tmp_path)])
    assert code == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_uninstrumented_run_is_attributed_from_python_stacks(profiled, capsys, private_cache):
    # no sptrace markers at all: phases from autograd's structure, modules from python stacks
    # and Sequence-number links, as on a Megatron-Core or DeepSpeed trace
    import sptrace
    from sptrace.detect import detect_collectives

    path = profiled("megatron-uninstrumented")
    run = sptrace.load_run(path, cache_dir=private_cache)
    names = run.ranks[0].table["name"].cast("string").to_pylist()
    assert not any(n.startswith("sptrace.") for n in names)
    frame = detect_collectives(run.ranks[2])
    layered = frame[frame["layer"].notna()]
    assert len(layered) == 20 and frame["layer"].isna().sum() == 1  # the norm-gradient all-reduce
    assert set(frame["phase"]) == {"forward", "backward"} and (frame["phase"] == "forward").sum() == 8
    backward = layered[layered["phase"] == "backward"]
    assert backward["source"].str.contains("module: Sequence number").all()
    assert set(backward[backward["kind"] == "reduce_scatter"]["module"]) == {
        "layers.0.ColumnParallelLinear_0", "layers.0.ColumnParallelLinear_1",
        "layers.1.ColumnParallelLinear_2", "layers.1.ColumnParallelLinear_3",
    }  # fmt: skip
    code, report = analyze(path, capsys)
    assert code == 0 and report["findings"] == []
