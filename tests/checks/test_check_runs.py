"""GIVEN profiled reference runs (8 gloo ranks), clean and with injected faults
WHEN sptrace check classifies every activation kept for backward
THEN clean runs pass on every rank, and each fault fails on every rank, naming its module with
the exact shape and bytes, from saved-tensor records or, without them, from memory events."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from sptrace.cli import main
from tests.suite import world_of

pytestmark = pytest.mark.distributed

FULL = 2 * 128 * 96 * 4  # [B, S, H] fp32


def check(path, capsys, *flags):
    code = main(["check", str(path), "--format", "json", *flags])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "name",
    [
        "megatron",
        "ulysses",
        "hybrid",
        "megatron-gqa-recompute",
        "ulysses-zero3-gqa",
        "hybrid-zero3",
        "megatron-uninstrumented",
    ],
)
def test_clean_runs_pass_on_every_rank(profiled, capsys, private_cache, name):
    code, report = check(profiled(name), capsys)
    assert code == 0 and report["ok"] and report["findings"] == []
    assert report["verdict"]["status"] == "pass" and report["counts"]["ambiguous"] == 0
    ranks = {s["rank"] for s in report["saved"]}
    assert ranks == set(range(world_of(name)))
    per_rank = [sum(1 for s in report["saved"] if s["rank"] == r) for r in ranks]
    assert min(per_rank) >= 10  # every rank's saved activations were judged
    assert not any(s["class"] == "full" for s in report["saved"])


def violations(report):
    return {(r, f["module"]) for f in report["findings"] for r in f["ranks"]}


def saved_full(report):
    """The full-size tensors the step itself keeps (autograd, the model): a buffer a collective
    filled whose holder the trace cannot show is a CANNOT DECIDE, never one of these."""
    return {(s["rank"], s["module"], tuple(s["shape"]) if s["shape"] else None, s["storage_bytes"])
            for s in report["saved"] if s["class"] == "full" and s["holder"] in ("autograd", "model")}  # fmt: skip


def test_stray_full_save(profiled, capsys):
    code, report = check(profiled("megatron-stray-full-save"), capsys)
    assert code == 1
    assert saved_full(report) == {(r, "layers.1.mlp.fc1", (256, 96), FULL) for r in range(8)}
    (f,) = report["findings"]  # one finding, on every rank
    assert f["code"] == "full-size-save" and f["layer"] == 1 and f["ranks"] == list(range(8))
    assert "96.00 KiB, 84.00 KiB more than a 1/8 shard" in f["message"] and "autograd" in f["message"]


def test_lean_profile_without_python_stacks_judges_the_same(profiled, capsys):
    """--lean drops the Python stacks (the profiler's costliest option): the markers name the
    modules, and the verdict, the full tensors and every tensor autograd saved (its record) are
    judged as in the full profile. (Tensors seen by memory events alone may differ by a gloo
    buffer or two between two launches: their frees happen on threads the profiler does not see.)"""
    lean = profiled("megatron-stray-full-save-lean")
    assert main(["info", str(lean), "--format", "json", "--no-cache"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert all(r["python_stacks"] == 0 and r["saved_tensor_records"] > 0 for r in info["per_rank"])
    code, report = check(lean, capsys)
    assert code == 1
    assert saved_full(report) == {(r, "layers.1.mlp.fc1", (256, 96), FULL) for r in range(8)}
    _, full = check(profiled("megatron-stray-full-save"), capsys)
    assert report["verdict"]["status"] == full["verdict"]["status"] == "fail"
    assert report["counts"]["full"] == full["counts"]["full"] == 8

    def records(r):
        return sorted((s["rank"], s["module"], tuple(s["shape"]), s["class"]) for s in r["saved"]
                      if s["source"] == "sptrace.saved record")  # fmt: skip

    assert records(report) == records(full) and len(records(report)) >= 8 * 10


def test_stray_full_save_in_ulysses_also_flags_the_view(profiled, capsys):
    code, report = check(profiled("ulysses-stray-full-save"), capsys)
    assert code == 1
    # the gathered input, and fc1's [B, S/P, F] output slice whose storage is the full [B, S, F]
    expected = {(r, "layers.0.mlp.fc1", (256, 96), FULL) for r in range(8)}
    expected |= {(r, "layers.0.mlp", (2, 16, 160), 2 * 128 * 160 * 4) for r in range(8)}
    assert saved_full(report) == expected


def test_missing_reduce_scatter_replicates_the_norm_input(profiled, capsys):
    code, report = check(profiled("megatron-missing-reduce-scatter"), capsys)
    assert code == 1
    full = saved_full(report)
    for r in range(8):
        assert (r, "layers.1.norm2", (2, 128, 96), FULL) in full
    assert all(module.startswith("layers.1") for _, module, _, _ in full)


def test_debug_hook(profiled, capsys):
    code, report = check(profiled("hybrid-debug-hook"), capsys)
    assert code == 1
    assert saved_full(report) == {(r, "layers.0", (2, 128, 96), FULL) for r in range(8)}


def test_without_saved_records_memory_events_still_catch_the_fault(profiled, capsys):
    name = "megatron-stray-full-save-uninstrumented"
    code, report = check(profiled(name), capsys)
    assert code == 1
    assert {r for r, _ in violations(report)} == set(range(world_of(name)))
    assert all(m == "layers.1.ColumnParallelLinear_3" for _, m in violations(report))  # fc1 of layer 1
    assert all(s["source"].startswith("memory events") for s in report["saved"])


def test_allow_junit_and_output_file(profiled, capsys, tmp_path):
    path = profiled("hybrid-debug-hook")
    assert main(["check", str(path), "--allow", "layers.0"]) == 0
    assert "PASS: every tensor alive at the boundary is sharded" in capsys.readouterr().out
    out = tmp_path / "reports" / "sharding.xml"
    assert main(["check", str(path), "--format", "junit", "--output", str(out)]) == 1
    suite = ET.parse(out).getroot().find("testsuite")
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["layers.0"]  # one case per module, all ranks together
    assert failed[0].find("failure").get("message").startswith("ranks 0-7: layers.0 keeps a full-sequence")
    assert int(suite.get("tests")) == len(cases) > 5 and int(suite.get("failures")) == 1


def test_unusable_input(corpus, capsys, tmp_path, profiled):
    # DLRM was profiled without profile_memory: nothing to judge, said at once (before any parse),
    # in one line naming the file
    assert main(["check", str(corpus / "param_dlrm_kineto"), "--batch", "1", "--seq", "8", "--hidden", "8",
                 "--sp", "8", "--cache-dir", str(tmp_path)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "param_dlrm_kineto/worker" in err, err
    assert "neither [memory] events nor sptrace.saved records" in err and "profile_memory=True" in err
    assert not any(tmp_path.rglob("*.arrow*"))  # nothing was parsed
    # once parsed (cached by another command), the same is the verdict of the whole run
    assert main(["info", str(corpus / "param_dlrm_kineto"), "--cache-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["check", str(corpus / "param_dlrm_kineto"), "--batch", "1", "--seq", "8", "--hidden", "8",
                 "--sp", "8", "--cache-dir", str(tmp_path)]) == 2  # fmt: skip
    out = capsys.readouterr().out
    assert "CANNOT DECIDE: ranks 0-7 have no [memory] events" in out
    assert "profile_memory=True" in out
    # nothing declared: every flag to pass in one line, before the traces are parsed (no cache
    # was written for this folder)
    fresh = tmp_path / "fresh-cache"
    assert main(["check", str(corpus / "param_dlrm_kineto"), "--cache-dir", str(fresh)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the sharding check needs --batch, --seq, --hidden (and --sp, unless" in err
    assert not fresh.exists() or not any(fresh.rglob("*.arrow*"))
    assert main(["check", str(profiled("megatron")), "--seq", "100"]) == 2
    assert "seq 100 is not divisible by the sequence-parallel size 8" in capsys.readouterr().err


def test_full_size_buffers_that_are_not_kept_pass(profiled, private_cache):
    # the gathered [S, B, H] input between all-gather and matmul, and reduce-scatter inputs,
    # are full-size allocations in forward; none is kept for backward, so none is flagged
    import sptrace
    from sptrace.detect.allocations import backward_start_ns, detect_retained
    from sptrace.detect.ledger import detect_ledger

    trace = sptrace.load_run(profiled("megatron-uninstrumented"), cache_dir=private_cache).ranks[3]
    ledger = detect_ledger(trace)
    forward_full = ledger[(ledger["bytes"] == FULL) & (ledger["alloc_ns"] < backward_start_ns(trace))]
    assert len(forward_full) >= 8  # 2 layers x (2 gathered inputs + 2 reduce-scatter inputs)
    retained = detect_retained(trace, element_size=4).tensors
    assert len(retained) > 10 and (retained["storage_bytes"] != FULL).all()


def test_cuda_memory_ledger_on_a_real_trace(corpus, private_cache):
    import gzip
    import json

    import sptrace
    from sptrace.detect.ledger import detect_ledger

    path = corpus / "hta_tests_data/df_index_resolver/df_index_resolver.json.gz"
    ledger = detect_ledger(sptrace.load_trace(path, cache_dir=private_cache))
    raw = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("name") == "[memory]"]
    allocs = [e for e in raw if e["args"]["Bytes"] > 0]
    assert len(ledger) == len(allocs)  # one record per allocation, closed or still live
    assert set(ledger["device_type"]) == {e["args"]["Device Type"] for e in allocs}
    assert ledger["bytes"].sum() == sum(e["args"]["Bytes"] for e in allocs)
    freed = ledger["free_ns"].notna()
    assert (ledger.loc[freed, "free_ns"] >= ledger.loc[freed, "alloc_ns"]).all()
