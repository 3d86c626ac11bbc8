"""Which of a rank's time windows (its forwards, one per boundary) hold each of many times, in
O((n + w) log w) instead of one pass over the times per window: a window of several hundred
iterations has several hundred boundaries, and a pass per boundary over a rank's events grows
with the square of its length.

Windows are half-open, [start, end). A boundary's forward window ends where its backward or the
next forward starts (sptrace.detect.boundaries), so they are disjoint except where two start at the
same time; those, and any other overlap, are answered exactly by a pass per overlapping window.
"""

from __future__ import annotations

import numpy as np


def in_any(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each time, is it inside at least one window: the windows started by then, less those
    ended by then, is more than none."""
    times = np.asarray(times)
    opened = np.searchsorted(np.sort(np.asarray(starts)), times, side="right")
    closed = np.searchsorted(np.sort(np.asarray(ends)), times, side="right")
    return opened > closed


def containing(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (time position, window position) pair where the window holds the time, ordered by
    window then time (what a pass per window, in the windows' order, visits)."""
    times = np.asarray(times, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if not len(starts) or not len(times):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    if np.all(e[:-1] <= s[1:]):  # disjoint: at most one window holds a time
        j = np.searchsorted(s, times, side="right") - 1
        hit = (j >= 0) & (times < e[np.maximum(j, 0)])
        at = np.flatnonzero(hit)
        window = order[j[hit]]
        by_window = np.lexsort((at, window))
        return at[by_window], window[by_window]
    pairs_at, pairs_window = [], []
    for w in range(len(starts)):  # overlapping windows: one exact pass each
        at = np.flatnonzero((times >= starts[w]) & (times < ends[w]))
        pairs_at.append(at)
        pairs_window.append(np.full(len(at), w, dtype=np.int64))
    return np.concatenate(pairs_at), np.concatenate(pairs_window)


def latest_containing(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each time, the last window (by position) that holds it; -1 for none."""
    at, window = containing(times, starts, ends)
    out = np.full(len(np.asarray(times)), -1, dtype=np.int64)
    np.maximum.at(out, at, window)
    return out
