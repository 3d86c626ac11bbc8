"""check_collectives on synthetic observations built from the cost model itself: a perfect run
matches; each kind of deviation yields its finding."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from sptrace.reference_models.config import StepConfig

from sptrace.checks import check_collectives
from sptrace.costmodel import estimate_comm
from sptrace.detect import COLUMNS


def observed(est, ranks=(0, 1)):
    rows = []
    t = 0.0
    for rank in ranks:
        for phase in ("forward", "backward"):
            layers = range(est.layers) if phase == "forward" else reversed(range(est.layers))
            for layer in layers:
                for c in est.collectives:
                    if c.per_layer and c.phase == phase:
                        t += 1
                        rows.append({"rank": rank, "kind": c.kind, "phase": phase, "layer": layer,
                                     "module": f"layers.{layer}.{c.module}", "in_bytes": c.in_bytes,
                                     "out_bytes": c.out_bytes, "wire_bytes": c.wire_bytes, "start_us": t})  # fmt: skip
        for c in est.collectives:
            if not c.per_layer:
                t += 1
                rows.append({"rank": rank, "kind": c.kind, "phase": c.phase, "layer": None, "module": c.module,
                             "in_bytes": c.in_bytes, "out_bytes": c.out_bytes, "wire_bytes": c.wire_bytes,
                             "start_us": t})  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


@pytest.fixture
def est():
    return estimate_comm(StepConfig(scheme="megatron"))


def test_a_perfect_run_matches(est):
    report = check_collectives(observed(est), est, [0, 1])
    assert report.ok and report.findings == []
    assert (report.ranks["observed_wire_bytes"] == est.wire_per_step()).all()


def test_each_deviation_has_its_finding(est):
    frame = observed(est)
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
    frame = observed(est)
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
    frame = observed(est)
    gone = frame.index[(frame["layer"] == 1) & (frame["phase"] == "forward") & (frame["kind"] == "all_gather")]
    report = check_collectives(frame.drop(index=gone[[0, len(gone) // 2]]), est, [0, 1])
    # THEN it is reported once, with its rank set
    (finding,) = report.findings
    assert finding.code == "missing-collective" and finding.ranks == (0, 1)
    assert finding.text().startswith("ranks 0-1: layer 1 forward: missing all_gather of ")
    assert finding.to_dict()["ranks"] == [0, 1]


def test_unknown_sizes_are_their_own_finding(est):
    # GIVEN a trace that does not record the size of one all-gather per rank (a TensorList op)
    frame = observed(est)
    first = frame.index[(frame["layer"] == 0) & (frame["kind"] == "all_gather")]
    frame.loc[first[[0, len(first) // 2]], ["in_bytes", "out_bytes", "wire_bytes"]] = None
    report = check_collectives(frame, est, [0, 1])
    # THEN it meets its expectation by kind and phase, is not a wrong-size error, and the verdict
    # cannot call the bytes a match
    assert report.ok and [f.code for f in report.findings] == ["size-unknown"]
    assert report.findings[0].ranks == (0, 1) and report.findings[0].severity == "warning"
    assert report.verdict.status == "undecided" and report.verdict.exit_code == 2
    assert "does not record the size of 2" in report.verdict.summary


def test_gradient_buckets_without_a_cap_compare_in_total():
    # GIVEN ulysses without a declared bucket cap: one expectation for all gradient all-reduces
    shape = StepConfig(scheme="ulysses").shape()
    est = estimate_comm(dataclasses.replace(shape, grad_bucket_mib=None))
    (total,) = [c for c in est.collectives if c.total_only]
    frame = observed(est)
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
