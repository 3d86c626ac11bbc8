"""GIVEN an 8-rank reference run mapped through the cache (tables released), and the same run
read with the cache off
WHEN a window of events is read from the run store (ranks x a time range on each rank's clock)
THEN it holds exactly the events of those ranks that overlap the window, as a filter over the
rank's whole table finds them, with a rank column, sorted; the cache-off run gives the same rows;
an empty window is an empty table with the columns."""

from __future__ import annotations

import pytest

from sptrace.load import load_trace
from sptrace.load.window import WINDOW_COLUMNS, event_window
from sptrace.run.map import MapSpec, map_run

pytestmark = pytest.mark.distributed


def expected(path, lo: int, hi: int):
    ev = load_trace(path, cache=False).events
    end = ev["ts_ns"] + ev["dur_ns"].fillna(0)
    return ev[(ev["ts_ns"] < hi) & (end >= lo)]


def test_window_is_the_filter_of_the_whole_table(profiled, private_cache):
    run, _ = map_run(profiled("megatron"), MapSpec((), cache_dir=private_cache))
    assert all(t.loaded is None for t in run)
    spans = {r: run.ranks[r].time_span_ns() for r in (2, 5)}
    lo = max(s[0] for s in spans.values()) + 50_000_000
    hi = lo + 20_000_000
    window = event_window(run, [5, 2], lo, hi)
    assert window.column_names == ["rank", *WINDOW_COLUMNS]
    ranks = window["rank"].to_pylist()
    assert ranks == sorted(ranks) and set(ranks) == {2, 5}
    for rank in (2, 5):
        mine = window.filter(window["rank"].to_numpy() == rank).to_pandas()
        want = expected(run.ranks[rank].path, lo, hi)
        assert len(mine) == len(want) > 20
        assert sorted(mine["name"].astype(str)) == sorted(want["name"].astype(str))
        assert list(mine["ts_ns"]) == sorted(want["ts_ns"])
    # the same window with the cache off: parsed again, filtered in memory, the same rows
    cold, _ = map_run(profiled("megatron"), MapSpec((), cache=False))
    again = event_window(cold, [5, 2], lo, hi)
    assert again.num_rows == window.num_rows and again["ts_ns"].to_pylist() == window["ts_ns"].to_pylist()
    # nothing there: an empty table that still has the columns
    empty = event_window(run, [2], 0, 1)
    assert empty.num_rows == 0 and empty.column_names == window.column_names
    assert event_window(run, [99], lo, hi).num_rows == 0
