"""GIVEN a rank's forward windows (disjoint as sptrace.detect.boundaries makes them, or touching,
sharing a start, overlapping, empty) and times on and around their edges
WHEN sptrace.detect.windows answers which windows hold each time
THEN the answers are exactly those of one pass per window (the passes it replaces), in the order
those passes visit them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sptrace.detect.windows import containing, in_any, latest_containing


def _by_passes(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    return [(int(t), w) for w in range(len(starts)) for t in np.flatnonzero((times >= starts[w]) & (times < ends[w]))]


windows = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(windows, st.lists(st.integers(-5, 240), max_size=60), st.booleans())
def test_windows_holding_each_time(spans, times, disjoint):
    if disjoint:  # as boundaries are: each ends where the next starts, or before
        spans = sorted(spans)
        spans = [(s, min(s + n, spans[i + 1][0]) if i + 1 < len(spans) else s + n) for i, (s, n) in enumerate(spans)]
    else:
        spans = [(s, s + n) for s, n in spans]
    rng = np.random.default_rng(len(times))
    order = rng.permutation(len(spans))  # boundaries need not be listed by their forward's start
    starts = np.array([spans[i][0] for i in order], dtype=np.int64)
    ends = np.array([spans[i][1] for i in order], dtype=np.int64)
    t = np.array(times, dtype=np.int64)
    at, window = containing(t, starts, ends)
    assert list(zip(at.tolist(), window.tolist())) == _by_passes(t, starts, ends)
    want_any = np.zeros(len(t), dtype=bool)
    want_last = np.full(len(t), -1)
    for i, w in _by_passes(t, starts, ends):
        want_any[i] = True
        want_last[i] = max(want_last[i], w)
    assert in_any(t, starts, ends).tolist() == want_any.tolist()
    assert latest_containing(t, starts, ends).tolist() == want_last.tolist()


def test_edges_and_shared_starts():
    starts, ends = np.array([10, 20, 20, 40]), np.array([20, 30, 25, 40])  # touching, sharing a start, empty
    t = np.array([9, 10, 19, 20, 24, 25, 29, 30, 40])
    assert latest_containing(t, starts, ends).tolist() == [-1, 0, 0, 2, 2, 1, 1, -1, -1]
    assert in_any(t, starts, ends).tolist() == [False, True, True, True, True, True, True, False, False]
