"""Containment queries in O(log n + depth): which ranges of a thread enclose a span, and which lie
inside one, for sptrace.detect.intervals.Intervals once a range set is large.

Sorted by (start, longest first), each range's parent is the latest-started range still open when
it starts (one sweep with a stack: a range is popped once a later one starts after its end). Every
range open at a time t is on the parent chain of the last range started at or before t: each link
is the latest-started range open at its child's start, so it cannot pass over one that is open at
t. The ranges enclosing a span are the ones of that chain that run to its end. This holds whether
the ranges nest (calls in calls) or not: the Python tracer's frames still open when the profiler
stops end a nanosecond after their caller, and ranges may touch (one ends where the next starts).

Hand-written: an interval tree (intervaltree, ncls) answers "which ranges overlap", with no order,
per query or in bulk; the analyses ask for the innermost range of a thread, one query at a time,
in the order the trace is read.
"""

from __future__ import annotations

import bisect

import numpy as np


class _Thread:
    """One thread's ranges: positions in the set, sorted by (start, -end), with their starts and
    ends in that order and each one's parent (a position in that order; -1 for none)."""

    __slots__ = ("end_list", "ends", "order", "order_list", "parent", "start_list", "starts")

    def __init__(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.order, self.starts, self.ends = order, starts, ends
        # Python lists too: a query reads a few values, and bisect and list indexing cost a tenth
        # of numpy's per-call overhead
        self.start_list, self.end_list, self.order_list = starts.tolist(), ends.tolist(), order.tolist()
        parent = [-1] * len(order)
        stack: list[tuple[int, int]] = []  # (position, end) of ranges begun, the latest on top
        for k, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            while stack and stack[-1][1] < s:  # ended before this one starts
                stack.pop()
            parent[k] = stack[-1][0] if stack else -1
            stack.append((k, e))
        self.parent = parent


class Nesting:
    """The per-thread index of one range set (start, end, tid arrays, as Intervals holds them)."""

    def __init__(self, start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> None:
        self._start, self._end = start, end
        order = np.lexsort((-end, start, tid))  # by thread, then start, outer first
        bounds = np.flatnonzero(np.diff(tid[order])) + 1
        self._threads: dict[int, _Thread] = {}
        for chunk in np.split(order, bounds):
            if len(chunk):
                self._threads[int(tid[chunk[0]])] = _Thread(chunk, start[chunk], end[chunk])

    def enclosing(self, start: int, end: int, tid: int | None) -> np.ndarray:
        """Positions of the ranges of ``tid`` (None: of any thread) containing [start, end],
        outermost first."""
        if tid is None:
            return self._ordered(np.concatenate([self.enclosing(start, end, t) for t in self._threads] or [[]]))
        t = self._threads.get(tid)
        if t is None:
            return np.empty(0, dtype=np.int64)
        k = bisect.bisect_right(t.start_list, start) - 1
        chain = []
        ends, parent, order = t.end_list, t.parent, t.order_list
        while k >= 0:
            if ends[k] >= end:
                chain.append(order[k])
            k = parent[k]
        chain.reverse()
        return np.array(chain, dtype=np.int64)

    def _ordered(self, positions: np.ndarray) -> np.ndarray:
        """``positions`` outermost first: by start, the longest first, then by position."""
        positions = positions.astype(np.int64)
        return positions[np.lexsort((positions, -self._end[positions], self._start[positions]))]

    def inside(self, start: int, end: int, tid: int | None) -> np.ndarray:
        """Positions of the ranges of ``tid`` (None: of any thread) that lie within [start, end],
        ascending."""
        if tid is None:
            return np.sort(np.concatenate([self.inside(start, end, t) for t in self._threads] or [[]]).astype(np.int64))
        t = self._threads.get(tid)
        if t is None:
            return np.empty(0, dtype=np.int64)
        lo = bisect.bisect_left(t.start_list, start)
        hi = bisect.bisect_right(t.start_list, end)
        keep = t.ends[lo:hi] <= end
        return np.sort(t.order[lo:hi][keep])
