"""The allocation ledger of one rank: its ``[memory]`` events sorted by (ts, Ev Idx) and keyed by
(device type, device id, Addr), each allocation with its free. An allocation on an address still
live means its free was never recorded: the old record is closed there as ``lost_free`` (it died at
some point before). A free with no allocation predates profiling. On CUDA, Bytes is the caching
allocator's block size. Also: where a CUDA device's allocator count moved without a recorded event
(``unrecorded_allocator_activity``), and the ledger's rows by address (``AddressIndex``).
sptrace.detect.allocations reads it for what a step keeps alive."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pandas as pd

from sptrace.detect.columns import empty_frame, is_one_of, take_columns
from sptrace.load.trace import RankTrace

LEDGER_COLUMNS = ["device_type", "device_id", "addr", "bytes", "alloc_ns", "free_ns", "lost_free", "tid", "free_tid"]


class Allocation(NamedTuple):
    """One allocation of the ledger (a row of LEDGER_COLUMNS): its device and address, its
    bytes, when it was made and freed (None or NaN: no free in the trace), whether the free was
    lost (its address was allocated again first), its thread, and the thread of its recorded free."""

    device_type: int
    device_id: int
    addr: int
    bytes: int
    alloc_ns: int
    free_ns: float | None
    lost_free: bool
    tid: float | None
    free_tid: float | None = None


_MEMORY: dict[int, tuple[weakref.ref, pd.DataFrame]] = {}
"""A rank's [memory] events by its event table's id, kept while that table lives: the ledger and
the allocator's unrecorded activity both read them (a filter and a sort of the whole table each).
(A DataFrame is unhashable, so no WeakKeyDictionary.)"""


_MEMORY_COLUMNS = ["ts_ns", "ev_idx", "tid", "device_type", "device_id", "mem_addr", "mem_bytes", "mem_total_allocated"]
"""What the ledger and the allocator's count read of a [memory] event."""


def _memory_events(trace: RankTrace) -> pd.DataFrame:
    """The [memory] events that carry Bytes, in the allocator's order (ts, then Ev Idx)."""
    ev = trace.events
    kept = _MEMORY.get(id(ev))
    if kept is not None and kept[0]() is ev:
        return kept[1]
    is_memory = is_one_of(ev["name"], ["[memory]"]) & ev["mem_bytes"].notna().to_numpy()
    mem = take_columns(ev, is_memory, _MEMORY_COLUMNS)
    if len(mem):  # (a trace without memory events has nothing to order: a sort's set-up saved)
        mem = mem.sort_values(["ts_ns", "ev_idx"], kind="stable", na_position="first")
    key = id(ev)
    _MEMORY[key] = (weakref.ref(ev, lambda _, key=key: _MEMORY.pop(key, None)), mem)
    return mem


def detect_ledger(trace: RankTrace) -> pd.DataFrame:
    mem = _memory_events(trace)
    if mem.empty:  # (no memory profile: most traces of a job; the frames' set-up is most of the cost)
        return empty_frame(LEDGER_COLUMNS)
    mem = mem[mem["mem_addr"].notna()]
    live: dict[tuple, Allocation] = {}
    rows: list[Allocation] = []
    for dt, di, addr, nbytes, ts, tid in zip(
        mem["device_type"].to_numpy(dtype=np.int64, na_value=-1).tolist(),
        mem["device_id"].to_numpy(dtype=np.int64, na_value=-1).tolist(),
        mem["mem_addr"].to_numpy(dtype=np.int64).tolist(),
        mem["mem_bytes"].to_numpy(dtype=np.int64).tolist(),
        mem["ts_ns"],
        mem["tid"],
    ):
        key = (dt, di, addr)
        if nbytes > 0:
            old = live.pop(key, None)
            if old is not None:
                rows.append(old._replace(free_ns=int(ts), lost_free=True, free_tid=None))
            live[key] = Allocation(*key, bytes=int(nbytes), alloc_ns=int(ts), free_ns=None, lost_free=False, tid=tid)
        elif nbytes < 0:
            rec = live.pop(key, None)
            if rec is not None:
                rows.append(rec._replace(free_ns=int(ts), free_tid=tid))
    rows.extend(live.values())
    frame = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    return frame.sort_values("alloc_ns", kind="stable").reset_index(drop=True)


@dataclass
class Unrecorded:
    """Per device: the intervals (start, end] of recorded [memory] events between which the
    allocator's Total Allocated moved by more than the recorded Bytes, and the last event's time."""

    starts: np.ndarray
    ends: np.ndarray
    last_ns: int

    def quiet(self, after_ns: int, until_ns: int) -> bool:
        """Whether the count shows nothing unrecorded from ``after_ns`` to ``until_ns`` (and the
        device has an event at or after ``until_ns``, so the last interval is observed)."""
        if self.last_ns < until_ns:
            return False
        return not bool(np.any((self.ends > after_ns) & (self.starts < until_ns)))


_COUNTS_EVERY_THREAD = (1,)
"""Device types whose Total Allocated counts every thread's allocations: CUDA's caching allocator
(its device stats). c10's CPU reporter counts only threads with the profiler on."""


def unrecorded_allocator_activity(trace: RankTrace) -> dict[tuple[int, int], Unrecorded]:
    """Where each CUDA device's allocator count moved without a recorded event explaining it; a
    device whose events carry no Total Allocated is left out (nothing can be read from it)."""
    mem = _memory_events(trace)
    counted = mem["device_type"].isin(_COUNTS_EVERY_THREAD).to_numpy()
    if not counted.any():
        return {}
    kind = mem["device_type"].to_numpy(dtype=np.int64, na_value=-1)
    device = mem["device_id"].to_numpy(dtype=np.int64, na_value=-1)
    known = mem["mem_total_allocated"].notna().to_numpy()
    ts_all = mem["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
    total_all = mem["mem_total_allocated"].to_numpy(dtype=np.int64, na_value=0)
    bytes_all = mem["mem_bytes"].to_numpy(dtype=np.int64, na_value=0)
    out: dict[tuple[int, int], Unrecorded] = {}
    for dt, di in dict.fromkeys(zip(kind[counted].tolist(), device[counted].tolist())):  # in order seen
        at = np.flatnonzero(counted & (kind == dt) & (device == di))
        if not known[at].all():
            continue
        ts, total = ts_all[at], total_all[at]
        moved = np.flatnonzero(np.diff(total) != bytes_all[at][1:])
        out[(dt, di)] = Unrecorded(ts[moved], ts[moved + 1], int(ts[-1]))
    return out


class AddressIndex:
    """The ledger's rows by address, so that finding the allocation a saved tensor's storage
    pointer names looks at that address's few rows, not the whole ledger (a mask over every row
    per saved tensor cost most of a rank's retained-tensor detection)."""

    def __init__(self, ledger: pd.DataFrame) -> None:
        self.ledger = ledger
        self.rows = ledger.groupby("addr", sort=False).indices if len(ledger) else {}
        self.alloc = ledger["alloc_ns"].to_numpy(dtype=np.int64)
        self.free = ledger["free_ns"].to_numpy(dtype=np.float64, na_value=np.nan)  # as the column compares

    def allocation_at(self, addr: int, ts: int) -> tuple[int, Allocation] | None:
        """The latest allocation (in ledger order) at ``addr`` that is alive at ``ts``, with its
        row number in the ledger."""
        rows = self.rows.get(addr)
        if rows is None:
            return None
        free = self.free[rows]
        hit = rows[(self.alloc[rows] <= ts) & (np.isnan(free) | (free > ts))]
        if not len(hit):
            return None
        last = int(hit[-1])
        return last, self.record(last)

    def record(self, row: int) -> Allocation:
        """Ledger row ``row`` (a position: the ledger's index is 0..n-1)."""
        return Allocation(*self._records[row])

    @cached_property
    def _records(self) -> list[tuple]:
        return list(zip(*(self.ledger[c].tolist() for c in LEDGER_COLUMNS)))
