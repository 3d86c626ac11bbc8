"""GIVEN range sets as traces have them (each thread's ranges nested as calls nest, zero-length
ranges, ranges sharing a start or an end, and threads whose ranges overlap without nesting)
WHEN sptrace.detect.nesting answers which ranges enclose a span and which lie inside one
THEN, for one thread or any, it answers exactly what a scan of every range answers, in the same order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sptrace.detect.nesting import Nesting


def _nested(draw, lo: int, hi: int, depth: int, out: list[tuple[int, int]]) -> None:
    """Calls inside [lo, hi]: siblings one after another, each with calls of its own."""
    t = lo
    while depth and t < hi and draw(st.booleans()):
        s = draw(st.integers(t, hi))
        e = draw(st.integers(s, min(hi, s + (hi - s) // 1)))
        out.append((s, e))
        _nested(draw, s, e, depth - 1, out)
        t = e + draw(st.integers(0, 3))


@st.composite
def range_sets(draw):
    starts, ends, tids = [], [], []
    for tid in range(draw(st.integers(1, 3))):
        ranges: list[tuple[int, int]] = []
        _nested(draw, 0, 200, 5, ranges)
        if draw(st.booleans()):  # a thread whose ranges overlap without nesting
            ranges += [(s, s + draw(st.integers(0, 60))) for s in draw(st.lists(st.integers(0, 200), max_size=8))]
        ranges += ranges[: draw(st.integers(0, 2))]  # identical ranges
        for s, e in ranges:
            starts.append(s)
            ends.append(e)
            tids.append(tid)
    order = draw(st.permutations(range(len(starts))))  # the table's order is not time order
    pick = np.array(order, dtype=np.int64)
    return (np.array(starts, dtype=np.int64)[pick] if len(pick) else np.empty(0, np.int64),
            np.array(ends, dtype=np.int64)[pick] if len(pick) else np.empty(0, np.int64),
            np.array(tids, dtype=np.int64)[pick] if len(pick) else np.empty(0, np.int64))  # fmt: skip


def _scan_enclosing(start, end, tid, s, e, t):
    idx = np.flatnonzero((s <= start) & (end <= e) & ((t == tid) if tid is not None else True))
    return idx[np.lexsort((-e[idx], s[idx]))]


@settings(max_examples=600, deadline=None)
@given(
    range_sets(),
    st.lists(st.tuples(st.integers(-5, 205), st.integers(0, 30), st.none() | st.integers(0, 3)), max_size=20),
)
def test_the_index_answers_as_a_scan_does(ranges, queries):
    s, e, t = ranges
    index = Nesting(s, e, t)
    for start, length, tid in queries:
        end = start + length
        assert index.enclosing(start, end, tid).tolist() == _scan_enclosing(start, end, tid, s, e, t).tolist()
        on = (t == tid) if tid is not None else np.ones(len(t), bool)
        assert index.inside(start, end, tid).tolist() == np.flatnonzero((start <= s) & (e <= end) & on).tolist()


def test_touching_and_overrunning_ranges():
    # siblings that touch (one ends where the next starts), a child a nanosecond past its caller's
    # end (the Python tracer's frames open when the profiler stops), and a partial overlap
    s = np.array([0, 0, 10, 10, 30, 31, 50], dtype=np.int64)
    e = np.array([100, 10, 20, 12, 101, 40, 60], dtype=np.int64)
    t = np.zeros(len(s), dtype=np.int64)
    index = Nesting(s, e, t)
    for q in range(-1, 103):
        for length in (0, 1, 5):
            assert index.enclosing(q, q + length, 0).tolist() == _scan_enclosing(q, q + length, 0, s, e, t).tolist()
            assert index.inside(q, q + length, 0).tolist() == np.flatnonzero((q <= s) & (e <= q + length)).tolist()
    assert index.enclosing(10, 10, 0).tolist() == [0, 1, 2, 3]  # the call that ended at 10 still encloses 10
    assert index.enclosing(101, 101, 0).tolist() == [4]


def test_a_large_set_answers_the_same_once_indexed():
    import pandas as pd

    from sptrace.detect.intervals import Intervals

    rng = np.random.default_rng(3)
    s = rng.integers(0, 10_000, 2000)
    frame = pd.DataFrame({"ts_ns": s, "dur_ns": rng.integers(0, 300, 2000), "tid": rng.integers(0, 3, 2000)})
    iv = Intervals(frame)
    e, t = iv.end, iv.tid
    for q in rng.integers(0, 10_000, 700).tolist():  # the first 256 scan, the rest use the index
        tid = q % 4 if q % 5 else None
        assert iv.enclosing(q, q + 3, tid).tolist() == _scan_enclosing(q, q + 3, tid, s, e, t).tolist()
        on = (t == tid) if tid is not None else np.ones(len(t), bool)
        assert iv.inside(q, q + 400, tid).tolist() == np.flatnonzero((q <= s) & (e <= q + 400) & on).tolist()
    assert "_nesting" in iv.__dict__
