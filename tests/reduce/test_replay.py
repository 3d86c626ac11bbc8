"""GIVEN a two-rank step written by hand (each rank computes in layer 0, meets the other at an
all-gather, then computes in layer 1; rank 1 computes 20 us longer before it)
WHEN it is replayed with nothing changed, and with a module, a rank, the transfers or the balance
of the ranks changed
THEN the replay reproduces the measured step exactly, and each prediction is the one worked out by
hand below from the same dependencies (a collective ends its transfer time after its last member's
arrival)."""

from __future__ import annotations

import pandas as pd
import pytest

from sptrace.reduce.replay import Changes, replay
from sptrace.reduce.replay_graph import BUSY, IDLE, WAIT, build_replay_graph

#  rank 0: layers.0.mlp [0, 30]  -> all_gather (arrives 30) ... waits to 60 -> layers.1.mlp [60, 100]
#  rank 1: layers.0.mlp [0, 50]  -> all_gather (arrives 50), transfer 10 -> 60 -> layers.1.mlp [60, 100]
WORK = {
    r: pd.DataFrame({"start_us": [0.0, 60.0], "dur_us": [first, 40.0], "module": ["layers.0.mlp", "layers.1.mlp"],
                     "phase": ["forward", "forward"], "lane": ["cpu", "cpu"]})
    for r, first in ((0, 30.0), (1, 50.0))
}  # fmt: skip
COLLECTIVES = pd.DataFrame({
    "rank": [0, 1], "kind": ["all_gather", "all_gather"], "start_us": [30.0, 50.0], "dur_us": [30.0, 10.0],
    "transfer_start_us": [30.0, 50.0], "transfer_dur_us": [30.0, 10.0], "seq": [1, 1], "group_size": [2, 2],
    "module": ["layers.0.attn"] * 2, "layer": [0, 0], "phase": ["forward"] * 2,
})  # fmt: skip
MEMBERS = pd.DataFrame({"rank": [0, 1], "start_us": [30.0, 50.0], "group": ["0", "0"], "key": ["1", "1"]})
WINDOWS = {0: (0.0, 100.0), 1: (0.0, 100.0)}


@pytest.fixture
def graph():
    return build_replay_graph(COLLECTIVES, MEMBERS, {}, WINDOWS, WORK)


def test_the_graph_tiles_each_window(graph):
    r0, r1 = graph.ranks[0], graph.ranks[1]
    assert list(r0.kind) == [BUSY, WAIT, BUSY] and list(r0.dur_us) == [30.0, 30.0, 40.0]
    assert list(r1.kind) == [BUSY, WAIT, BUSY] and list(r1.dur_us) == [50.0, 10.0, 40.0]
    assert graph.collectives == 1 and graph.unseen == 0 and graph.measured_us == 100.0
    assert list(graph.members["transfer_us"]) == [10.0, 10.0]  # from the last arrival (50) to the end (60)


@pytest.mark.parametrize(
    ("changes", "predicted"),
    [
        (Changes(), 100.0),
        # both ranks' layer 0 halves: arrivals 15 and 25, the gather ends at 35, layer 1 ends at 75
        (Changes(modules=(("layers.0", 0.5),)), 75.0),
        # rank 1 computes at 0.6: it arrives at 30, the gather ends at 40; rank 0 then computes 40 more
        (Changes(compute=0.6, ranks=frozenset({1})), 80.0),
        # half the transfer: the gather ends at 55
        (Changes(comm=0.5), 95.0),
        (Changes(kinds={"all_gather": 0.0}), 90.0),
        (Changes(kinds={"all_reduce": 0.0}), 100.0),  # no all-reduce in the step: nothing moves
        # layer 0 at the median rank's 40 us: arrivals 40, end 50, layer 1 at 40 each
        (Changes(balance=True), 90.0),
        # nobody waits: rank 0's gather ends at 40 and it finishes at 80; rank 1 still at 100
        (Changes(no_wait=True), 100.0),
        (Changes(no_wait=True, compute=0.5, ranks=frozenset({1})), 80.0),
    ],
)
def test_predictions_follow_the_dependencies(graph, changes, predicted):
    result = replay(graph, changes)
    assert result.step_us == pytest.approx(predicted)
    assert result.forced == 0


def test_the_replayed_critical_path_goes_through_the_late_rank(graph):
    result = replay(graph, Changes(modules=(("layers.1", 0.5),)))
    path = result.path(graph)
    assert path is not None and path.step_us == pytest.approx(80.0)
    seg = path.segments
    # rank 1's layer 0 (50 us), the transfer (10 us), then layer 1 at half (20 us)
    assert list(seg["kind"]) == ["compute", "transfer", "compute"]
    assert list(seg["dur_us"]) == pytest.approx([50.0, 10.0, 20.0])
    # (both ranks end at 80: the walk starts on rank 0, whose wait goes back through rank 1)
    assert list(seg["rank"]) == [1, 1, 0] and list(seg["module"]) == ["layers.0.mlp", "layers.0.attn", "layers.1.mlp"]


def test_an_idle_stretch_nothing_released_stays_as_measured():
    work = {0: pd.DataFrame({"start_us": [0.0, 70.0], "dur_us": [50.0, 30.0], "module": ["a", "b"],
                             "phase": ["forward"] * 2, "lane": ["cpu"] * 2})}  # fmt: skip
    empty = COLLECTIVES.iloc[:0]
    g = build_replay_graph(empty, None, {}, {0: (0.0, 100.0)}, work)
    assert list(g.ranks[0].kind) == [BUSY, IDLE, BUSY]
    assert replay(g, Changes(compute=0.5)).step_us == pytest.approx(60.0)  # 25 + 20 idle + 15


def test_a_replay_the_trace_contradicts_says_it_is_off():
    """Rank 1 'arrives' at 70, after rank 0's gather ended at 60 on rank 0's clock (clocks the
    matching could not align): the replay cannot reproduce the step, and says so with what it lacks."""
    from sptrace.whatif import StepWhatIf, WhatIf

    late = COLLECTIVES.assign(start_us=[30.0, 70.0], transfer_start_us=[30.0, 70.0], dur_us=[30.0, 0.0],
                              transfer_dur_us=[30.0, 0.0])  # fmt: skip
    members = MEMBERS.assign(start_us=[30.0, 70.0])
    work = {0: WORK[0], 1: WORK[1].assign(dur_us=[70.0, 30.0], start_us=[0.0, 70.0])}
    g = build_replay_graph(late, members, {}, WINDOWS, work)
    base = replay(g)
    assert base.step_us == pytest.approx(110.0)  # rank 0 now waits for 70, then computes 40
    result = WhatIf(Changes(), (StepWhatIf(None, g.measured_us, base.step_us, base.step_us, base.forced),), None,
                    ("1 collective with members the trace does not hold",))  # fmt: skip
    assert result.error == pytest.approx(0.1) and not result.calibrated
    assert result.calibration_line() == (
        "+10.0% off the measured step, more than 5%, one profiled step: the prediction may be off by as much; "
        "the graph lacks 1 collective with members the trace does not hold"
    )
