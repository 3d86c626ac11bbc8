"""GIVEN models written the way users write them, profiled with plain torch.profiler (memory
events, record_shapes; no sptrace markers or saved-tensor records)
WHEN sptrace check judges what each rank keeps across the forward -> backward boundary
THEN its verdict agrees with an independent oracle (a saved_tensors_hooks census, the tensors the
model holds itself, what the SAC policy cached) and says "cannot decide" when the trace cannot
show enough."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from datetime import datetime

import pytest

from sptrace.cli import main

pytestmark = pytest.mark.distributed
WORLD = 8
B, S, H = 2, 64, 48
SHAPE = ["--batch", str(B), "--seq", str(S), "--hidden", str(H), "--workers", "1"]


def oracle(root, name, rank=0):
    return json.loads((root / "oracle" / name / f"rank{rank}.json").read_text())


def whole(entry) -> bool:
    """DTensor's own word, in the census: every placement Replicate() ("R") is the whole tensor
    on this rank (a gathered sequence), a Shard(d) placement ("S(d)") a 1/P piece."""
    return bool(entry["placements"]) and all(p in ("R", "Replicate()") for p in entry["placements"])


def spans_the_sequence(shape) -> bool:
    """The census's shape fact for plain tensors: S tokens (or B*S flattened) and at least H
    elements per token. The models below build these tensors from a gathered sequence."""
    n = 1
    for d in shape:
        n *= d
    tokens = B * S if (B * S in shape or (S in shape and B in shape)) else S if S in shape else None
    return tokens is not None and n // tokens >= H


def check(root, name, capsys, cache, *flags):
    code = main(["check", str(root / name), "--format", "json", "--cache-dir", str(cache), *SHAPE, *flags])
    return code, json.loads(capsys.readouterr().out)


KEEPERS = ("autograd", "model")


def kept_full(report):
    """The full-size tensors the step itself keeps (autograd, the model)."""
    return [s for s in report["saved"] if s["class"] == "full" and s["holder"] in KEEPERS]


def undecided(report):
    """Tensors that could be full-size whose holder the trace cannot show."""
    return [s for s in report["saved"] if s["group"] == "undecided"]


def cannot_decide_names_the_buffers(report) -> bool:
    """A CANNOT DECIDE that names what it lacks: the collective buffers with no holder the trace can
    show (gloo frees them on its own thread), and the one step that decides (sptrace.instrument)."""
    reasons = " ".join(report["verdict"]["reasons"])
    rows = undecided(report)
    return (bool(rows) and "no holder the trace can show" in reasons and "sptrace.instrument" in reasons
            and all(s["collective"] for s in rows))  # fmt: skip


def full_per_rank(report):
    rows = kept_full(report)
    return {r: sorted(tuple(s["shape"]) for s in rows if s["rank"] == r) for r in range(WORLD)}


def test_native_colwise_parallel_keeps_the_gathered_input(user_runs, capsys, private_cache):
    code, report = check(user_runs, "tp_sp_native", capsys, private_cache)
    assert code == 1 and report["verdict"]["status"] == "fail"
    for rank in range(WORLD):
        census = [s for s in oracle(user_runs, "tp_sp_native", rank)["saved"] if not s["param"]]
        # the census sees DTensors' local shards; count each storage once, as memory does
        full = {s["storage"] for s in census if whole(s)}
        assert any(s["dtensor"] for s in census)
        assert len(full_per_rank(report)[rank]) == len(full) == 4  # q/k/v's shared input and fc1's, x 2 layers
    findings = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert {f["layer"] for f in findings} == {0, 1}
    assert all(f["ranks"] == list(range(WORLD)) for f in findings)  # one finding per fact, not per rank
    assert all("gathered full sequence" in f["message"] and "autograd" in f["message"] for f in findings)


def test_a_full_tensor_held_in_a_python_list_fails(user_runs, capsys, private_cache):
    """The model appends each layer's gathered sequence (the very buffer its all-gather filled) to
    a Python list, cleared once the step is done. Autograd keeps nothing full (torch's census); the
    list's hold is what the trace shows: each buffer is freed after backward, outside any autograd
    node, on the model's thread. The gate fails in both layers on every rank, saying the model
    holds it and why."""
    o = oracle(user_runs, "stray_list")
    census = [s for s in o["saved"] if not s["param"]]
    assert not any(spans_the_sequence(s["shape"]) for s in census)  # autograd itself keeps nothing full
    code, report = check(user_runs, "stray_list", capsys, private_cache, "--ffn", "96")
    assert code == 1 and report["verdict"]["status"] == "fail"
    held = [math.prod(s) for s in o["held"]]
    for rank in range(WORLD):
        rows = [s for s in kept_full(report) if s["rank"] == rank]
        assert sorted(math.prod(s["shape"]) for s in rows) == sorted(held), rank
        assert {s["layer"] for s in rows} == {0, 1} and {s["holder"] for s in rows} == {"model"}
    found = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert {f["layer"] for f in found} == {0, 1} and all(f["ranks"] == list(range(WORLD)) for f in found)
    assert all(f["holder"] == "model" and "freed after it outside autograd" in f["evidence"] for f in found)


def test_4h_ffn_at_p4_is_judged_by_origin_without_ffn(user_runs, capsys, private_cache):
    """F/P = H (a 4H MLP at P = 4): fc1's output and its GELU have the shape of a full [B, S, H]
    activation. Their origin decides, not their shape: fc1's matmul contracts H with this rank's
    [F/P, H] weight (a column-parallel product), and the GELU is computed from it."""
    flags = ["--sp", "4"]
    census = [s for s in oracle(user_runs, "ffn4h_p4")["saved"] if not s["param"]]
    collide = [s for s in census if spans_the_sequence(s["shape"])]  # [B, S, F/P]: the shape of [B, S, H]
    assert collide and all(s["shape"][-1] == H for s in collide)
    code, report = check(user_runs, "ffn4h_p4", capsys, private_cache, *flags)
    assert report["counts"]["ambiguous"] == 0 and report["counts"]["full"] == 0
    shards = [s for s in report["saved"] if s["class"] == "head-sharded" and s["shape"] and s["shape"][-1] == H]
    assert len(shards) >= WORLD * len(collide) and {s["origin"] for s in shards} == {"column"}
    # the model gathers into buffers gloo may free unrecorded: PASS, or CANNOT DECIDE naming them
    assert code == 0 or (code == 2 and cannot_decide_names_the_buffers(report)), report["verdict"]
    # --ffn agrees with the trace, and changes nothing
    code2, report2 = check(user_runs, "ffn4h_p4", capsys, private_cache, *flags, "--ffn", "192")
    assert report2["counts"] == report["counts"] and code2 == code


def test_forward_only_window_cannot_decide(user_runs, capsys, private_cache):
    code, report = check(user_runs, "forward_only", capsys, private_cache, "--sp", "8")
    assert code == 2 and report["verdict"]["status"] == "undecided"
    assert "no backward" in report["verdict"]["summary"]
    assert main(["check", str(user_runs / "forward_only"), "--cache-dir", str(private_cache), *SHAPE, "--sp", "8"]) == 2
    assert "CANNOT DECIDE: the profiled window has no backward" in capsys.readouterr().out


def test_selective_checkpointing_keeps_are_seen(user_runs, capsys, private_cache):
    """The SAC policy MUST_SAVEs the functional all-gather's output (the policy's own record of
    what it kept, by op): each gathered tensor it cached is in the report on every rank, full-size,
    and the check fails: the cache gives the tensor up inside a backward node, so autograd holds it."""
    sac = oracle(user_runs, "sac")["sac"]
    cached = {math.prod(shape) for op, shape in sac if "all_gather" in op or "wait_tensor" in op}
    assert cached  # the policy cached the gathered sequence
    code, report = check(user_runs, "sac", capsys, private_cache, "--sp", "8")
    assert code == 1 and report["verdict"]["status"] == "fail"  # the cache is freed inside a backward node
    for rank in range(WORLD):
        rows = [s for s in report["saved"] if s["rank"] == rank and s["group"] in ("full", "undecided")]
        assert cached <= {math.prod(s["shape"]) for s in rows if s["shape"]}, rank
        assert {s["layer"] for s in rows} == {0, 1}, rank
    assert sum(len(s) for s in full_per_rank(report).values()) >= WORLD  # most are judged, and fail


def test_clean_selective_checkpointing_instrumented_passes(user_runs, capsys, private_cache):
    """The clean SAC block (its policy saves only matmul outputs and recomputes the gather in
    backward), with sptrace.instrument as the README says: every tensor the policy kept is a
    [B, S/P, H] shard by its own record, and the census of what Python holds at the boundary
    tells a gathered buffer gloo freed on its own thread from one the model kept, so a SAC user
    gets a green gate, every time."""
    kept = oracle(user_runs, "sac_clean")["sac"]
    assert kept and {math.prod(shape) for _, shape in kept} == {B * S // WORLD * H}
    assert not any("all_gather" in op or "wait_tensor" in op for op, _ in kept)
    code, report = check(user_runs, "sac_clean", capsys, private_cache, "--sp", "8")
    assert report["counts"]["full"] == 0 and report["counts"]["ambiguous"] == 0
    assert report["coverage"]["census"] == list(range(WORLD))  # sptrace.instrument's census, every rank
    assert (code, report["verdict"]["status"]) == (0, "pass"), report["verdict"]
    assert not undecided(report)
    for rank in range(WORLD):  # the kept shards are judged on every rank, in both layers
        judged = [s for s in report["saved"] if s["rank"] == rank and s["class"] == "seq-sharded"]
        assert {s["layer"] for s in judged} == {0, 1}, rank


def test_deepspeed_ulysses_sequence_first_passes(user_runs, capsys, private_cache):
    """DeepSpeed-Ulysses' own layout: sequence-first [S/P, B, H] blocks whose q, k, v are
    [S/P, B, a, d] until an all-to-all gives each rank the whole sequence for a/P heads (the
    all-to-all's [P, S/P, B, a/P, d] buffer). torch's census: nothing autograd saved holds the
    whole sequence at full width, so the step is clean; every saved all-to-all buffer is a
    head shard, never "a few tokens of the sequence"."""
    census = [s for s in oracle(user_runs, "deepspeed_ulysses")["saved"] if not s["param"]]
    assert census and not any(spans_the_sequence(s["shape"]) for s in census)
    heads = 8
    code, report = check(user_runs, "deepspeed_ulysses", capsys, private_cache, "--sp", "8", "--heads", str(heads))
    assert (code, report["verdict"]["status"]) == (0, "pass"), report["verdict"]
    d = H // heads
    for rank in range(WORLD):
        a2a = [
            s
            for s in report["saved"]
            if s["rank"] == rank and s["origin"] == "all-to-all" and s["origin_text"].startswith("made by")
        ]  # (not what attention computed from them)
        # an all-to-all moves as many bytes as it takes: each buffer is 1/P of the sequence's
        assert a2a and all(s["storage_bytes"] == S * B * H // WORLD * 4 for s in a2a), rank
        assert not {s["class"] for s in a2a} & {"full", "ambiguous", "other"}, rank
        # DeepSpeed's own buffer layout for q, k, v: the whole sequence (P chunks of S/P) for
        # a/P heads, in both layers
        buffers = [s for s in a2a if s["shape"] == [WORLD, S // WORLD, B, heads // WORLD, d]]
        assert len(buffers) >= 2 * 3 and {s["class"] for s in buffers} == {"head-sharded"}, rank
    # without --heads the same verdict: the layout comes from the trace
    code2, report2 = check(user_runs, "deepspeed_ulysses", capsys, private_cache, "--sp", "8")
    assert code2 == 0, report2["verdict"]


def test_a_wrong_declaration_cannot_decide(user_runs, capsys, private_cache):
    ok, _ = check(user_runs, "list_allgather", capsys, private_cache)
    assert ok == 0
    for flag, value in (("--seq", "128"), ("--batch", "3"), ("--hidden", "96")):
        argv = [str(user_runs / "list_allgather"), "--cache-dir", str(private_cache), *SHAPE, flag, value]
        assert main(["check", *argv]) == 2
        assert "matches no tensor in the trace" in capsys.readouterr().out


def test_junit_reports_each_module_once_with_its_ranks(user_runs, capsys, private_cache, tmp_path):
    out = tmp_path / "check.xml"
    argv = ["check", str(user_runs / "tp_sp_native"), "--cache-dir", str(private_cache), *SHAPE, "--format", "junit"]
    assert main([*argv, "--output", str(out)]) == 1
    suite = ET.parse(out).getroot().find("testsuite")
    cases = suite.findall("testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed) == 4
    assert len({c.get("name") for c in cases}) == len(cases)  # a module once, not once per rank
    assert all("ranks 0-7:" in c.find("failure").get("message") for c in failed)
    # the suite names the run, and says when it ran and how long the whole check took
    assert suite.get("name") == f"sptrace check {user_runs / 'tp_sp_native'}"
    assert float(suite.get("time")) > 0 and datetime.fromisoformat(suite.get("timestamp")).tzinfo is not None
    verdict = next(c for c in cases if c.get("name") == "verdict")
    assert verdict.get("time") == suite.get("time")


def test_instrumented_dtensor_records_are_judged_by_their_local_shard(user_runs, capsys, private_cache):
    # GIVEN the native TP+SP model with sptrace.instrument added: saved-tensor records of DTensors
    code, report = check(user_runs, "tp_sp_instrumented", capsys, private_cache)
    assert code == 1
    records = [s for s in report["saved"] if s["source"] == "sptrace.saved record" and s["rank"] == 0]
    census = [s for s in oracle(user_runs, "tp_sp_instrumented")["saved"] if not s["param"]]
    # THEN each record has the local shape the census saw (a Shard(1) norm input is [B, S/P, H], not
    # its global [B, S, H]), under its module's full path
    assert {(r["module"], tuple(r["shape"])) for r in records} <= {(c["module"], tuple(c["shape"])) for c in census}
    norms = [r for r in records if r["module"].endswith("attention_norm")]
    assert norms and all(r["shape"][1] == S // WORLD for r in norms if len(r["shape"]) == 3)
    # AND the same four gathered inputs per rank fail as without records
    assert all(len(shapes) == 4 for shapes in full_per_rank(report).values())


def _full_rows(report):
    return kept_full(report)


def test_a_stray_in_one_micro_batch_fails_and_names_it(user_runs, capsys, private_cache):
    """Gradient accumulation, f0 b0 f1 b1 in one step: only micro-batch 1 keeps a gathered input.
    Each forward is judged across the boundary of the backward that consumes it, so the stray
    fails the check, named in its micro-batch, and micro-batch 0 keeps nothing full."""
    truth = oracle(user_runs, "accumulation")["stray"]
    assert truth["full_saved"]  # the census saw autograd keep the gathered input
    code, report = check(user_runs, "accumulation", capsys, private_cache, "--sp", "8")
    assert code == 1 and report["verdict"]["status"] == "fail"
    full = _full_rows(report)
    assert {s["rank"] for s in full} == set(range(WORLD))
    assert {s["micro_batch"] for s in full} == {truth["micro_batch"]}
    assert {s["storage_bytes"] for s in full} >= {s["storage_bytes"] for s in truth["full_saved"]}
    assert {s["layer"] for s in full} == {1}
    assert {s["micro_batch"] for s in report["saved"]} == {0, 1}  # both boundaries judged
    findings = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert findings and all(f"micro-batch {truth['micro_batch']}" in f["message"] for f in findings)


def test_a_stray_in_the_second_profiled_step_fails_and_names_it(user_runs, capsys, private_cache):
    """A profiler schedule with two active steps; the stray runs only in the second. Every step's
    boundary is judged: the check fails, naming the step the profiler was at when the stray ran."""
    truth = oracle(user_runs, "two_steps")["stray"]
    assert truth["step"] == 2 and truth["full_saved"]
    code, report = check(user_runs, "two_steps", capsys, private_cache, "--sp", "8")
    assert code == 1 and report["verdict"]["status"] == "fail"
    full = _full_rows(report)
    assert {s["rank"] for s in full} == set(range(WORLD))
    assert {s["step"] for s in full} == {truth["step"]}
    assert {s["step"] for s in report["saved"]} == {1, 2}  # both active steps judged
    assert {s["storage_bytes"] for s in full} >= {s["storage_bytes"] for s in truth["full_saved"]}
    findings = [f for f in report["findings"] if f["code"] == "full-size-save"]
    assert findings and all(f"step {truth['step']}" in f["message"] for f in findings)


def test_diff_names_the_stray_a_user_model_added(user_runs, capsys, private_cache):
    """The same user model and step twice, once with the debug list that keeps each layer's
    gathered sequence: `sptrace diff` names each layer that began keeping a full-size tensor, with
    the held tensors' size (as the model recorded what its list held), and the list's own
    all-gathers as the only collectives added. The list is cleared once the step is done: the free
    the trace records after backward, outside autograd, shows the model held each buffer."""
    held = oracle(user_runs, "stray_list")["held"]
    assert oracle(user_runs, "stray_list_clean")["held"] == []
    code = main(["diff", str(user_runs / "stray_list_clean"), str(user_runs / "stray_list"), "--format", "json",
                 "--cache-dir", str(private_cache), *SHAPE, "--ffn", "96"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    new_full = [k for k in report["retained"] if k["became_full"]]
    assert sorted(k["new"]["layer"] for k in new_full) == list(range(len(held)))  # one module per layer
    added = sum(k["new"]["full"] - (k["base"]["full"] if k["base"] else 0) for k in new_full)
    assert added >= len(held), json.dumps(new_full, indent=1)
    sizes = {math.prod(json.loads(t[: t.index("]") + 1])) for k in new_full for t in k["new"]["full_shapes"]}
    assert sizes == {math.prod(s) for s in held}
    # the list's own all-gathers (one per layer, in forward) are the only collectives added
    changed = {(c["phase"], c["layer"], c["kind"]): c for c in report["communication"]}
    assert set(changed) == {("forward", layer, "all_gather") for layer in range(len(held))}
    assert all(c["new"]["count"] - c["base"]["count"] == 1 for c in changed.values())


def test_two_pipeline_stages_of_sp_ranks(user_runs, capsys, private_cache):
    """Two pipeline stages of four SP ranks each, one profiled step, no sptrace code: each stage's
    MLP saves only sequence shards (torch's census), so nothing the step keeps is full-size. A
    buffer an all-gather filled that gloo's thread dropped last has no free in the trace: PASS, or
    CANNOT DECIDE naming exactly those buffers and the step that decides them."""
    census = [s for r in range(WORLD) for s in oracle(user_runs, "pp2_sp4", r)["saved"] if not s["param"]]
    assert census and not any(spans_the_sequence(s["shape"]) for s in census)
    code, report = check(user_runs, "pp2_sp4", capsys, private_cache, "--sp", "4")
    assert not kept_full(report) and report["counts"]["ambiguous"] == 0
    assert code == 0 or (code == 2 and cannot_decide_names_the_buffers(report)), report["verdict"]
