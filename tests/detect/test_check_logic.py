"""check_collectives against a Megatron-SP step written out from the scheme's own table (SPEC
section 1: per layer 4 collectives forward and 6 backward, each moving one [S/P, B, H] shard to
or from the whole [S, B, H] across the P ranks, then one all-reduce of the norms' gradients):
the numbers below come from B, S, H, P and that table, never from sptrace's cost model. A perfect
step matches; each kind of deviation yields its finding."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.checks import check_collectives
from sptrace.costmodel import estimate_comm
from sptrace.detect import COLUMNS

B, S, H, P, L, FP32 = 2, 128, 96, 8, 2, 4  # the reference default StepConfig(scheme="megatron")
SHARD, FULL = B * S // P * H * FP32, B * S * H * FP32  # 12 KiB, 96 KiB
NORMS = L * 2 * H * FP32  # two LayerNorm weights per layer, all-reduced once after backward
RING = (P - 1) / P
# SPEC section 1, Megatron sequence parallelism: (phase, collective, module)
TABLE = [
    ("forward", "all_gather", "attn.qkv"), ("forward", "reduce_scatter", "attn.proj"),
    ("forward", "all_gather", "mlp.fc1"), ("forward", "reduce_scatter", "mlp.fc2"),
    ("backward", "all_gather", "mlp.fc2"),  # 5: the output gradient
    ("backward", "all_gather", "mlp.fc1"), ("backward", "reduce_scatter", "mlp.fc1"),  # 6, 7
    ("backward", "all_gather", "attn.proj"), ("backward", "all_gather", "attn.qkv"),  # 8-10
    ("backward", "reduce_scatter", "attn.qkv"),
]  # fmt: skip


def row(rank, phase, kind, layer, module, t, group=P):
    into, out = (SHARD, FULL) if kind == "all_gather" else (FULL, SHARD)
    wire = out * (group - 1) / group if kind == "all_gather" else into * (group - 1) / group
    return {"rank": rank, "kind": kind, "phase": phase, "layer": layer, "module": module, "in_bytes": into,
            "out_bytes": out, "group_size": group, "wire_bytes": wire, "start_us": t}  # fmt: skip


def observed(ranks=(0, 1)):
    rows, t = [], 0.0
    for rank in ranks:
        for phase in ("forward", "backward"):
            for layer in range(L) if phase == "forward" else reversed(range(L)):
                for ph, kind, module in TABLE:
                    if ph == phase:
                        t += 1
                        rows.append(row(rank, phase, kind, layer, f"layers.{layer}.{module}", t))
        t += 1
        rows.append({"rank": rank, "kind": "all_reduce", "phase": "backward", "layer": None, "module": None,
                     "in_bytes": NORMS, "out_bytes": NORMS, "group_size": P, "wire_bytes": 2 * NORMS * RING,
                     "start_us": t})  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def per_layer_as_estimated(est, ranks=(0, 1)):
    """Every per-layer collective exactly as ``est`` says, plus its step-level ones: only for the
    tests about the step-level gradient totals, where the per-layer part is not what is tested."""
    rows, t = [], 0.0
    for rank in ranks:
        for c in est.collectives:
            for layer in range(est.layers) if c.per_layer else [None]:
                t += 1
                rows.append({"rank": rank, "kind": c.kind, "phase": c.phase, "layer": layer, "module": c.module,
                             "in_bytes": c.in_bytes, "out_bytes": c.out_bytes, "group_size": c.group_size,
                             "wire_bytes": c.wire_bytes, "start_us": t})  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


@pytest.fixture
def est():
    return estimate_comm(StepConfig(scheme="megatron"))


def test_a_perfect_run_matches(est):
    report = check_collectives(observed(), est, [0, 1])
    assert report.ok and report.findings == [] and report.verdict.label == "MATCH"
    # 10 * N * r per layer (SPEC section 1), plus the norms' all-reduce
    wire = L * 10 * SHARD * P * RING + 2 * NORMS * RING
    assert list(report.ranks["observed_wire_bytes"]) == pytest.approx([wire, wire])
    assert (report.ranks["observed"] == L * 10 + 1).all() and (report.ranks["expected"] == L * 10 + 1).all()


def test_a_collective_in_a_smaller_group_is_not_a_match(est):
    """The same input bytes in a group of 4 instead of 8: half the output, less on the wire."""
    frame = observed()
    i = frame.index[(frame["rank"] == 1) & (frame["layer"] == 0) & (frame["phase"] == "forward")][0]
    frame.loc[i] = pd.Series(row(1, "forward", "all_gather", 0, "layers.0.attn.qkv", frame.at[i, "start_us"], 4))
    frame.loc[i, "out_bytes"] = SHARD * 4
    frame.loc[i, "wire_bytes"] = SHARD * 3
    report = check_collectives(frame, est, [0, 1])
    (finding,) = report.findings
    assert (finding.code, finding.ranks, finding.layer) == ("wrong-group", (1,), 0)
    assert "group of 4 ranks where the scheme's has 8" in finding.message
    assert report.verdict.label == "MISMATCH"


def test_a_collective_whose_group_is_unknown_cannot_match(est):
    frame = observed()
    frame.loc[frame["kind"] == "reduce_scatter", ["group_size", "wire_bytes"]] = None
    report = check_collectives(frame, est, [0, 1])
    assert {f.code for f in report.findings} == {"group-unknown"}
    assert report.verdict.label == "CANNOT DECIDE" and report.verdict.exit_code == 2


def test_each_deviation_has_its_finding(est):
    frame = observed()
    r0 = frame["rank"] == 0
    fwd_l1 = frame.index[r0 & (frame["layer"] == 1) & (frame["phase"] == "forward")]
    frame = frame.drop(index=fwd_l1[0])  # layer 1's first forward all-gather
    frame.loc[fwd_l1[1], "in_bytes"] = 999  # its reduce-scatter: wrong size
    r0 = frame["rank"] == 0
    bwd_l0 = frame.index[r0 & (frame["layer"] == 0) & (frame["phase"] == "backward")]
    frame.loc[bwd_l0[0], "phase"] = "forward"  # wrongly placed
    extra = frame.loc[[fwd_l1[2]]].assign(start_us=1e9, kind="all_reduce", in_bytes=4096)
    frame = pd.concat([frame, extra])  # an all-reduce the scheme never issues
    report = check_collectives(frame, est, [0, 1])
    codes = sorted((f.code, f.ranks, f.layer) for f in report.findings)
    assert codes == [
        ("extra-collective", (0,), 1), ("missing-collective", (0,), 1), ("wrong-phase", (0,), 0),
        ("wrong-size", (0,), 1),
    ]  # fmt: skip
    assert report.verdict.status == "fail" and report.verdict.exit_code == 1
    assert not report.ok and report.ranks.set_index("rank").loc[1, "missing"] == 0


def test_out_of_order_is_a_warning(est):
    frame = observed()
    idx = frame.index[(frame["rank"] == 1) & (frame["layer"] == 0) & (frame["phase"] == "forward")]
    a, b = idx[0], idx[1]  # swap the first all-gather and reduce-scatter of layer 0
    frame.loc[a, "start_us"], frame.loc[b, "start_us"] = frame.loc[b, "start_us"], frame.loc[a, "start_us"]
    report = check_collectives(frame, est, [0, 1])
    assert report.ok  # order is a warning, not a contract breach
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.ranks, finding.layer) == ("order", "warning", (1,), 0)
    assert "collective #1 is a forward reduce_scatter" in finding.message


def test_a_finding_on_every_rank_is_one_finding(est):
    # GIVEN the same collective missing on both ranks
    frame = observed()
    gone = frame.index[(frame["layer"] == 1) & (frame["phase"] == "forward") & (frame["kind"] == "all_gather")]
    report = check_collectives(frame.drop(index=gone[[0, len(gone) // 2]]), est, [0, 1])
    # THEN it is reported once, with its rank set
    (finding,) = report.findings
    assert finding.code == "missing-collective" and finding.ranks == (0, 1)
    assert finding.text().startswith("ranks 0-1: layer 1 forward: missing all_gather of ")
    assert finding.to_dict()["ranks"] == [0, 1]


def test_unknown_sizes_are_their_own_finding(est):
    # GIVEN a trace that does not record the size of one all-gather per rank (a TensorList op)
    frame = observed()
    first = frame.index[(frame["layer"] == 0) & (frame["kind"] == "all_gather")]
    frame.loc[first[[0, len(first) // 2]], ["in_bytes", "out_bytes", "wire_bytes"]] = None
    report = check_collectives(frame, est, [0, 1])
    # THEN it meets its expectation by kind and phase, is not a wrong-size error, and the verdict
    # cannot call the bytes a match
    assert report.ok and [f.code for f in report.findings] == ["size-unknown"]
    assert report.findings[0].ranks == (0, 1) and report.findings[0].severity == "warning"
    assert report.verdict.status == "undecided" and report.verdict.exit_code == 2
    assert report.verdict.summary.endswith("does not record the size of 2")


def test_gradient_buckets_without_a_cap_compare_in_total():
    # GIVEN ulysses without a declared bucket cap: one expectation for all gradient all-reduces
    shape = StepConfig(scheme="ulysses").shape()
    est = estimate_comm(dataclasses.replace(shape, grad_bucket_mib=None))
    (total,) = [c for c in est.collectives if c.total_only]
    frame = per_layer_as_estimated(est)
    sync = frame[frame["module"] == "grad_sync"]
    # WHEN the job split them into three buckets of any sizes
    parts = [total.in_bytes // 4, total.in_bytes // 2, total.in_bytes - total.in_bytes // 4 - total.in_bytes // 2]
    buckets = pd.concat([sync.assign(in_bytes=n, start_us=sync["start_us"] + i) for i, n in enumerate(parts)])
    ok = check_collectives(pd.concat([frame[frame["module"] != "grad_sync"], buckets]), est, [0, 1])
    assert ok.verdict.status == "pass", [f.text() for f in ok.findings]
    # THEN only a different total is wrong
    short = buckets[buckets["in_bytes"] != parts[0]]
    bad = check_collectives(pd.concat([frame[frame["module"] != "grad_sync"], short]), est, [0, 1])
    assert [f.code for f in bad.findings] == ["wrong-size"] and bad.findings[0].ranks == (0, 1)
