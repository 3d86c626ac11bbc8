"""check_collectives on synthetic observations built from the cost model itself: a perfect run
matches; each kind of deviation yields its finding."""

from __future__ import annotations

import pandas as pd
import pytest

from sptrace.checks import check_collectives
from sptrace.config import StepConfig
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
    codes = sorted((f.code, f.rank, f.layer) for f in report.findings)
    assert codes == [
        ("extra-collective", 0, 1), ("missing-collective", 0, 1), ("wrong-phase", 0, 0), ("wrong-size", 0, 1)
    ]  # fmt: skip
    assert not report.ok and report.ranks.set_index("rank").loc[1, "missing"] == 0


def test_out_of_order_is_a_warning(est):
    frame = observed(est)
    idx = frame.index[(frame["rank"] == 1) & (frame["layer"] == 0) & (frame["phase"] == "forward")]
    a, b = idx[0], idx[1]  # swap the first all-gather and reduce-scatter of layer 0
    frame.loc[a, "start_us"], frame.loc[b, "start_us"] = frame.loc[b, "start_us"], frame.loc[a, "start_us"]
    report = check_collectives(frame, est, [0, 1])
    assert report.ok  # order is a warning, not a contract breach
    (finding,) = report.findings
    assert (finding.code, finding.severity, finding.rank, finding.layer) == ("order", "warning", 1, 0)
    assert "collective #1 is a forward reduce_scatter" in finding.message
