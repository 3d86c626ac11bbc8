"""The Timeline's window of the lanes (sptrace.lane_window): at most about ``max_points`` points
however many rows the run has, and what a reader looks for survives the decimation (the longest
collectives, the worst straggler, every phase, compute's busy time); a narrower window gives back
the detail; a run under the budget is drawn whole."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sptrace.lane_window import lane_view
from sptrace.report import timeline
from tests.report.test_figures import analysis

N = 3000
"""Collectives per rank: 6000 in all, 3000 compute intervals and 3000 phases a rank too."""


@pytest.fixture(scope="module")
def long_run():
    rng = np.random.default_rng(7)
    rows, members, matched, compute, phases = [], [], [], [], []
    for i in range(N):
        t = 1000.0 * i
        skew = float(rng.uniform(0, 20))
        for rank in (0, 1):
            late = skew if rank == i % 2 else 0.0
            dur = float(rng.uniform(5, 50))
            rows.append({"rank": rank, "kind": "all_gather" if i % 3 else "reduce_scatter", "op": "c10d::x",
                         "start_us": t + late, "dur_us": dur, "transfer_start_us": None, "transfer_dur_us": None,
                         "module": f"layers.{i % 4}", "phase": "forward", "in_bytes": 8, "wire_bytes": 8.0,
                         "layer": i % 4})  # fmt: skip
            members.append({"rank": rank, "group": "g", "key": i, "start_us": t + late, "skew_us": late})
            compute.append({"rank": rank, "start_us": t + 60.0, "dur_us": 300.0})
            phases.append({"rank": rank, "phase": "forward" if i % 2 else "backward", "start_us": t,
                           "dur_us": 1000.0})  # fmt: skip
        matched.append({"group": "g", "key": i, "ranks": [0, 1], "straggler": i % 2, "algbw_gbps": 1.0,
                        "busbw_gbps": 1.0, "kind": "all_gather", "in_bytes": 8, "arrival_skew_us": skew})  # fmt: skip
    frame = pd.DataFrame(rows)
    longest = frame["dur_us"].idxmax()
    frame.loc[longest, "dur_us"] = 900.0  # one collective far longer than the rest
    matched = pd.DataFrame(matched)
    worst = int(matched["arrival_skew_us"].idxmax())
    return analysis(frame, offsets={0: 0.0, 1: 0.0}, phases=pd.DataFrame(phases), compute=pd.DataFrame(compute),
                    matched=matched, members=pd.DataFrame(members)), longest, worst  # fmt: skip


def test_a_long_run_is_decimated_under_the_cap(long_run):
    a, longest, worst = long_run
    view = lane_view(a, [0, 1], max_points=3000, resolution=800)
    assert view.decimated and view.points <= 3000
    assert view.totals["collectives"] == 2 * N and len(view.collectives) < 2 * N
    # every collective of the window is drawn or counted by the bar that stands for it
    assert len(view.collectives) + int(view.collectives["hidden"].sum()) == 2 * N
    # the longest collective survives; so does the worst straggler's marker
    assert longest in view.collectives.index
    t = a.collectives.loc[longest]
    assert view.collectives.loc[longest, "bar_dur"] == 900.0 and t["dur_us"] == 900.0
    assert view.stragglers["skew_us"].max() == pytest.approx(a.matching.matched["arrival_skew_us"].iloc[worst])
    # every phase on every lane; compute merged, its busy time kept
    assert {(r, p) for r, p in zip(view.phases["rank"], view.phases["phase"])} == {
        (r, p) for r in (0, 1) for p in ("forward", "backward")}  # fmt: skip
    assert view.compute["busy_us"].sum() == pytest.approx(2 * N * 300.0)
    assert view.compute["count"].sum() == 2 * N
    assert (view.compute["dur_us"] >= view.compute["busy_us"] - 1e-6).all()
    # the figure draws exactly these points
    fig = timeline.draw(a, view)
    assert sum(len(tr.x) for tr in fig.data) <= view.points <= 3000
    assert fig.layout.meta["decimated"] and "zoom in" in fig.layout.title.text


def test_a_narrow_window_gives_back_the_detail(long_run):
    a, _, _ = long_run
    whole = lane_view(a, [0, 1], max_points=3000, resolution=800)
    lo_ms, hi_ms = 100.0, 130.0  # 30 of the run's 3000 ms
    zoomed = lane_view(a, [0, 1], window=(lo_ms, hi_ms), max_points=3000, resolution=800)
    t0 = a.step_zero_us

    def inside(v):
        s = (v.collectives["bar_start"] - t0) / 1e3
        return int(((s >= lo_ms) & (s <= hi_ms)).sum())

    assert inside(zoomed) > inside(whole)
    assert not zoomed.decimated  # 30 ms of 2 ranks: every collective of the window
    # only the window's rows (and its margins): nothing of the rest of the run
    lo, hi = zoomed.lo_us, zoomed.hi_us
    assert lo < t0 + lo_ms * 1e3 and hi > t0 + hi_ms * 1e3
    for frame, start, dur in ((zoomed.collectives, "bar_start", "bar_dur"), (zoomed.phases, "s", "dur_us"),
                              (zoomed.compute, "s", "dur_us")):  # fmt: skip
        assert ((frame[start] <= hi) & (frame[start] + frame[dur] >= lo)).all()
    assert zoomed.points < whole.points
    fig = timeline.draw(a, zoomed)
    assert list(fig.layout.xaxis.range) == pytest.approx([lo_ms, hi_ms])  # the range zoomed to, as asked


def test_a_short_run_is_drawn_whole(long_run):
    a, _, _ = long_run
    view = lane_view(a, [0, 1], window=(0.0, 20.0))
    assert not view.decimated and view.bucket_us == 0
    assert len(view.collectives) == view.totals["collectives"] and (view.collectives["hidden"] == 0).all()
    assert len(view.compute) == view.totals["compute"]


def test_the_cap_holds_at_any_budget(long_run):
    a, longest, _ = long_run
    for cap in (200, 1000, 10_000):
        view = lane_view(a, [0, 1], max_points=cap, resolution=1600)
        assert view.points <= cap, cap
        assert longest in view.collectives.index
