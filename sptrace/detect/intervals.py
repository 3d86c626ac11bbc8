"""Containment queries over trace ranges ("which annotation encloses this op?").

Hand-written because the question is interval nesting per thread with "innermost wins", which
neither pandas nor pyarrow answer directly. A small set is scanned; a large one (a rank's ops and
Python frames) is indexed per thread (sptrace.detect.nesting)."""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

from sptrace.detect.nesting import Nesting

_SCAN_FIXED = 9500
"""What a scan costs besides its ranges, in ranges: a scan of n ranges costs about as much as one
of n + _SCAN_FIXED ranges would cost without numpy's per-call overhead (4 us for a few, 25 us for
50,000, on this project's machines)."""
_BUILD = 500
"""What the nesting index's sweep costs per range, in scanned ranges (about 0.2 us a range, 15 us
set-up: _BUILD_FIXED)."""
_BUILD_FIXED = 37500


class Intervals:
    """Ranges [start, end] in ns, each with a thread id and a payload row.

    Built from a frame (``Intervals(frame)``), or as a selection of a base table's rows
    (``Intervals.of(table, rows)``) whose frame is taken only when a caller asks for it: a
    trace's table has about 40 columns, and taking every one of them for each of a rank's
    dozen range sets cost more than all the queries made on them."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._base, self._rows = frame, None
        self.start = frame["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
        dur = (
            frame["dur_ns"].to_numpy(dtype=np.int64, na_value=0)
            if "dur_ns" in frame
            else np.zeros(len(frame), np.int64)
        )
        self.end = self.start + dur
        self.tid = frame["tid"].to_numpy(dtype=np.int64, na_value=-1) if "tid" in frame else np.full(len(frame), -1)

    @classmethod
    def of(cls, table: EventTable, rows: np.ndarray) -> Intervals:
        """The rows ``rows`` (positions, or a boolean mask) of ``table``."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        out = cls.__new__(cls)
        out._base, out._rows = table.frame, rows
        out.__dict__["_names"] = table.names
        out.__dict__["_columns"] = table.columns
        out.start, out.end, out.tid = table.start[rows], table.end[rows], table.tid[rows]
        return out

    def subset(self, keep: np.ndarray | list[int]) -> Intervals:
        """Ranges ``keep`` (positions in this set) as a set of their own."""
        keep = np.asarray(keep, dtype=np.int64)
        if self._rows is None:
            return Intervals(self.frame.iloc[keep])
        out = Intervals.__new__(Intervals)
        out._base, out._rows = self._base, self._rows[keep]
        out.__dict__["_names"] = self._names
        out.__dict__["_columns"] = self._columns
        out.start, out.end, out.tid = self.start[keep], self.end[keep], self.tid[keep]
        return out

    @cached_property
    def frame(self) -> pd.DataFrame:
        """The ranges' rows, 0..n-1."""
        if self._rows is None:
            return self._base.reset_index(drop=True)
        return self._base.iloc[self._rows].reset_index(drop=True)

    def column(self, name: str) -> pd.Series:
        """One column of the ranges' rows, 0..n-1 (without taking the others)."""
        base = self._base[name]
        if self._rows is None:
            return base.reset_index(drop=True)
        if isinstance(base.dtype, pd.api.extensions.ExtensionDtype):  # (Int64, categorical: 4x faster than iloc)
            return pd.Series(base.array.take(self._rows), name=name, copy=False)
        return base.iloc[self._rows].reset_index(drop=True)

    def __len__(self) -> int:
        return len(self.start)

    def name(self, i: int) -> str:
        """Range i's event name."""
        return str(self._names[self._at(i)])

    @cached_property
    def _columns(self) -> dict[str, object]:
        """The base table's column arrays, as its rows have read them (EventRow)."""
        return {}

    @cached_property
    def _names(self) -> np.ndarray:
        """The base table's event names, as objects (one conversion, not a pandas lookup per
        name asked for)."""
        return self._base["name"].to_numpy(dtype=object)

    def row(self, i: int) -> EventRow:
        """Range i's event, read column by column as it is asked for: ``frame.iloc[i]`` builds
        a whole Series and, over a frame of mixed nullable columns, finds a common type for
        every row it is asked for, which cost seconds on a 200k-event trace."""
        return EventRow(self._base, self._at(i), self._columns)

    def _at(self, i: int) -> int:
        return i if self._rows is None else int(self._rows[i])

    @cached_property
    def _nesting(self) -> Nesting:
        """The per-thread index of a large set's ranges (sptrace.detect.nesting)."""
        return Nesting(self.start, self.end, self.tid)

    def _indexed(self) -> bool:
        """Answer from the index? Once the scans made of the set have cost as much as its sweep
        would (rent until the rent paid is the price: never more than twice what the best choice,
        known in advance, would cost): 5 scans of 20 ranges, 125 of 3,000, up to 500 of a huge set.
        A set asked a few times (sptrace info's) is scanned; one asked for every allocation of a
        rank (its ops) is indexed early. Both answer the same (tests/detect/test_nesting.py)."""
        if "_nesting" in self.__dict__:
            return True
        n = len(self.start)
        asked = self.__dict__["_asked"] = self.__dict__.get("_asked", 0) + 1
        return asked * (n + _SCAN_FIXED) > _BUILD * n + _BUILD_FIXED

    def enclosing(self, start: int, end: int, tid: int | None = None) -> np.ndarray:
        """Indices of the ranges containing [start, end], outermost first."""
        if not len(self.start):
            return np.empty(0, dtype=np.int64)
        if self._indexed():
            return self._nesting.enclosing(int(start), int(end), None if tid is None else int(tid))
        mask = (self.start <= start) & (end <= self.end)
        if tid is not None:
            mask &= self.tid == tid
        idx = np.flatnonzero(mask)
        return idx[np.lexsort((-self.end[idx], self.start[idx]))]

    def innermost(self, start: int, end: int, tid: int | None = None) -> int | None:
        idx = self.enclosing(start, end, tid)
        return int(idx[-1]) if len(idx) else None

    def inside(self, start: int, end: int, tid: int | None = None) -> np.ndarray:
        """Indices of the ranges that lie within [start, end], ascending."""
        if not len(self.start):
            return np.empty(0, dtype=np.int64)
        if self._indexed():
            return self._nesting.inside(int(start), int(end), None if tid is None else int(tid))
        mask = (start <= self.start) & (self.end <= end)
        if tid is not None:
            mask &= self.tid == tid
        return np.flatnonzero(mask)


def within(ranges: Intervals, points: np.ndarray) -> np.ndarray:
    """For each point: does a range (of any thread) contain it? Vectorised over the points:
    the latest range starting at or before the point, or any open range, must still run."""
    if not len(ranges) or not len(points):
        return np.zeros(len(points), dtype=bool)
    order = np.argsort(ranges.start, kind="stable")
    starts = ranges.start[order]
    running_end = np.maximum.accumulate(ranges.end[order])  # latest end among ranges begun so far
    pos = np.searchsorted(starts, points, side="right") - 1
    ok = pos >= 0
    result = np.zeros(len(points), dtype=bool)
    result[ok] = running_end[pos[ok]] >= points[ok]
    return result


class EventRow:
    """One row of a frame, as a read-only mapping (``row["name"]``, ``row.get(...)``,
    ``row.name``): values are those ``frame[col].iat[i]`` gives. ``columns``: a cache of the
    frame's column arrays that rows of one frame share (a pandas column lookup and ``iat`` cost
    tens of microseconds each, and a rank asks for thousands of values)."""

    __slots__ = ("_columns", "_frame", "_i")

    def __init__(self, frame: pd.DataFrame, i: int, columns: dict[str, object] | None = None) -> None:
        self._frame = frame
        self._i = i
        self._columns = {} if columns is None else columns

    def __getitem__(self, key: str) -> object:
        values = self._columns.get(key)
        if values is None:
            values = self._columns[key] = self._frame[key].array
        return values[self._i]

    def get(self, key: str, default: object = None) -> object:
        return self[key] if key in self._frame.columns else default

    def __contains__(self, key: object) -> bool:
        return key in self._frame.columns

    def _asdict(self) -> dict[str, object]:
        """Every column's value (as a named tuple's ``_asdict``)."""
        return {key: self[key] for key in self._frame.columns}

    def __getattr__(self, key: str) -> object:
        if key.startswith("_") or key not in self._frame.columns:
            raise AttributeError(key)
        return self[key]


class EventTable:
    """A trace's event table with each row's start, end and thread as numpy arrays, read once
    for every range set selected from it (``Intervals.of``)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        probe = Intervals(frame)
        self.start, self.end, self.tid = probe.start, probe.end, probe.tid

        self.columns: dict[str, object] = {}
        """Column arrays its rows have read (EventRow)."""

    @cached_property
    def names(self) -> np.ndarray:
        return self.frame["name"].to_numpy(dtype=object)
