"""The cross-rank reduce on hand-built collective tables: matching and the point-to-point report
read one pairing of sends with receives, so they agree on what is paired and what is not; and
every time they show comes from the one time base (the expected values follow from how the
tables are built)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sptrace.detect.collectives import COLUMNS
from sptrace.reduce import timebase
from sptrace.reduce.matching import match_collectives
from sptrace.reduce.p2p import analyse_point_to_point

N = 4096


def op(rank, kind, peer, t, *, nbytes=N, transfer=True):
    """A send or receive issued at t (5 us on the CPU), whose transfer starts 1 us later and
    takes 4 us (none: ``transfer=False``)."""
    row = dict.fromkeys(COLUMNS)
    row.update(rank=rank, kind=kind, peer=peer, in_bytes=nbytes, out_bytes=nbytes, wire_bytes=nbytes,
               start_us=float(t), dur_us=5.0, transfer_start_us=float(t) + 1 if transfer else None,
               transfer_dur_us=4.0 if transfer else None, phase="forward", layer=0, module="attn",
               source="")  # fmt: skip
    return row


def ring(P):
    """Every rank sends to r+1 and receives from r-1, once."""
    return [o for r in range(P) for o in (op(r, "send", (r + 1) % P, r), op(r, "recv", (r - 1) % P, r + 0.5))]


def test_matching_and_the_report_pair_alike():
    """GIVEN a ring of 4 where rank 2's receive names rank 3 (pytorch#153819) though rank 1 sent
    it, and rank 3's receive is missing (rank 2's send is never received)
    THEN matching lists exactly the report's pairs, the misnamed receive's included, each with
    the report's transfer time and bandwidth, and counts as unmatched what the report leaves
    unpaired."""
    rows = [r for r in ring(4) if not (r["rank"] == 3 and r["kind"] == "recv")]
    next(r for r in rows if r["rank"] == 2 and r["kind"] == "recv")["peer"] = 3
    frame = pd.DataFrame(rows)[COLUMNS]
    m = match_collectives(frame)
    report = analyse_point_to_point(frame, pairing=m.pairing)
    assert report.pairs.equals(analyse_point_to_point(frame).pairs)  # the same pairs, paired again or not
    assert sorted(zip(report.pairs["src"], report.pairs["dst"])) == [(0, 1), (1, 2), (3, 0)]
    assert report.pairs["peer_disagrees"].tolist().count(True) == 1
    matched = m.matched.set_index("key")
    assert sorted(matched.index) == ["p2p:0->1#0", "p2p:1->2#0", "p2p:3->0#0"]
    by_hop = report.pairs.set_index(["src", "dst"])
    for (src, dst), hop in by_hop.iterrows():
        row = matched.loc[f"p2p:{src}->{dst}#0"]
        assert row["ranks"] == sorted([src, dst])
        assert row["transfer_us"] == hop["transfer_us"] and row["arrival_skew_us"] == hop["skew_us"]
        assert row["algbw_gbps"] == hop["algbw_gbps"] == row["busbw_gbps"]
    assert m.unmatched == len(report.unpaired) == 1
    assert list(zip(report.unpaired["rank"], report.unpaired["kind"])) == [(2, "send")]
    assert m.notes == ["1 sends or receives found no partner"]
    # each pair's members: the sender first, then the receiver, by their issue times
    first = m.members[m.members["key"] == "p2p:1->2#0"]
    assert first["rank"].tolist() == [1, 2] and first["start_us"].tolist() == [1.0, 2.5]


def test_the_time_base():
    """GIVEN a row with a transfer and one without
    THEN arrival and end are the transfer's where there is one, else the CPU issue span's; a
    transfer runs from the last arrival to the end; algbw is bytes / time and busbw scales it by
    the kind's factor, both unknown where a size, a time or a group's size is."""
    frame = pd.DataFrame([op(0, "send", 1, 10), op(1, "recv", 0, 20, transfer=False)])[COLUMNS]
    assert timebase.arrival_us(frame).tolist() == [11.0, 20.0]
    assert timebase.end_us(frame).tolist() == [15.0, 25.0]
    assert timebase.transfer_us(20.0, 25.0) == 5.0 and timebase.transfer_us(20.0, 15.0) == 0.0
    assert timebase.algbw_gbps(5e3, 5.0) == pytest.approx(1.0)
    assert math.isnan(timebase.algbw_gbps(None, 5.0)) and math.isnan(timebase.algbw_gbps(5e3, 0.0))
    assert timebase.busbw_gbps(1.0, "all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert timebase.busbw_gbps(1.0, "all_gather", 8) == pytest.approx(7 / 8)
    assert math.isnan(timebase.busbw_gbps(1.0, "all_reduce", None))


def test_clock_offsets_and_aligned_times():
    """GIVEN rank 1's clock 100 us ahead of rank 0's on two collectives they both completed
    THEN its offset is 100 us, and its times minus 100 us are on rank 0's clock; a rank with no
    offset stays as it is."""
    ends = pd.DataFrame({"rank": [0, 0, 1, 1], "group": ["g"] * 4, "key": [0, 1, 0, 1],
                         "end_us": [10.0, 20.0, 110.0, 120.0]})  # fmt: skip
    offsets = timebase.clock_offsets(ends)
    assert offsets == {0: 0.0, 1: 100.0}
    assert timebase.aligned(pd.Series([150.0, 150.0, 150.0]), pd.Series([0, 1, 2]), offsets).tolist() == [
        150.0, 50.0, 150.0
    ]  # fmt: skip
    assert timebase.aligned(150.0, 1, offsets) == 50.0


def test_clock_offsets_of_many_ranks_at_once():
    """GIVEN rank r's clock r x 10 us ahead, a rank matching nothing of rank 0's and one with an
    unknown end THEN each offset is its own (medians over its matches), 0 without a match, NaN
    with an unknown end; ranks in order."""
    rows = [(r, "g", k, 10.0 * k + 10.0 * r + (0.5 if k == 2 else 0.0)) for r in (3, 0, 1, 2) for k in range(3)]
    rows += [(4, "other", 0, 99.0), (5, "g", 0, 50.0), (5, "g", 1, float("nan"))]
    ends = pd.DataFrame(rows, columns=["rank", "group", "key", "end_us"])
    offsets = timebase.clock_offsets(ends)
    assert list(offsets) == [0, 1, 2, 3, 4, 5]
    assert [offsets[r] for r in range(4)] == [0.0, 10.0, 20.0, 30.0] and offsets[4] == 0.0
    assert math.isnan(offsets[5])


def test_a_partial_rank_is_realigned_by_its_missing_collectives():
    """GIVEN rank 1's trace starting one collective late and rank 2's the same as rank 0's
    THEN rank 1 is shifted by +1, rank 2 by 0."""
    from sptrace.reduce.matching import _shifts

    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_reduce"]
    rows = [(0, k) for k in kinds] + [(1, k) for k in kinds[1:]] + [(2, k) for k in kinds]
    g = pd.DataFrame(rows, columns=["rank", "kind"]).assign(in_bytes=8)
    assert _shifts(g, 0) == {0: 0, 1: 1, 2: 0}
