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

    def name(self, i: int) -> str:
        """Range i's event name."""
        return str(self.frame["name"].iat[i])

    def row(self, i: int) -> EventRow:
        """Range i's event, read column by column as it is asked for: ``frame.iloc[i]`` builds
        a whole Series and, over a frame of mixed nullable columns, finds a common type for
        every row it is asked for, which cost seconds on a 200k-event trace."""
        return EventRow(self.frame, i)

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


class EventRow:
    """One row of a frame, as a read-only mapping (``row["name"]``, ``row.get(...)``,
    ``row.name``): values are those ``frame[col].iat[i]`` gives."""

    __slots__ = ("_frame", "_i")

    def __init__(self, frame: pd.DataFrame, i: int) -> None:
        self._frame = frame
        self._i = i

    def __getitem__(self, key: str) -> object:
        return self._frame[key].iat[self._i]

    def get(self, key: str, default: object = None) -> object:
        return self._frame[key].iat[self._i] if key in self._frame.columns else default

    def __contains__(self, key: object) -> bool:
        return key in self._frame.columns

    def __getattr__(self, key: str) -> object:
        if key.startswith("_") or key not in self._frame.columns:
            raise AttributeError(key)
        return self._frame[key].iat[self._i]
