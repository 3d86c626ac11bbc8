"""Containment queries over trace ranges ("which annotation encloses this op?").

Hand-written because the question is interval nesting per thread with "innermost wins", which
neither pandas nor pyarrow answer directly; the sets involved are small (markers, collectives)."""

from __future__ import annotations

import numpy as np
import pandas as pd


class Intervals:
    """Ranges [start, end] in ns, each with a thread id and a payload row."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame.reset_index(drop=True)
        self.start = frame["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
        dur = (
            frame["dur_ns"].to_numpy(dtype=np.int64, na_value=0)
            if "dur_ns" in frame
            else np.zeros(len(frame), np.int64)
        )
        self.end = self.start + dur
        self.tid = frame["tid"].to_numpy(dtype=np.int64, na_value=-1) if "tid" in frame else np.full(len(frame), -1)

    def __len__(self) -> int:
        return len(self.frame)

    def enclosing(self, start: int, end: int, tid: int | None = None) -> np.ndarray:
        """Indices of the ranges containing [start, end], outermost first."""
        if not len(self.frame):
            return np.empty(0, dtype=np.int64)
        mask = (self.start <= start) & (end <= self.end)
        if tid is not None:
            mask &= self.tid == tid
        idx = np.flatnonzero(mask)
        return idx[np.lexsort((-self.end[idx], self.start[idx]))]

    def innermost(self, start: int, end: int, tid: int | None = None) -> int | None:
        idx = self.enclosing(start, end, tid)
        return int(idx[-1]) if len(idx) else None

    def inside(self, start: int, end: int, tid: int | None = None) -> np.ndarray:
        """Indices of the ranges that lie within [start, end]."""
        if not len(self.frame):
            return np.empty(0, dtype=np.int64)
        mask = (start <= self.start) & (self.end <= end)
        if tid is not None:
            mask &= self.tid == tid
        return np.flatnonzero(mask)
